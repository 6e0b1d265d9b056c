"""Peak memory of a streamed `datasets` corpus read into a short training run, at two corpus sizes.

    python benchmarks/stream_memory.py                        # a 100 MB and a 1 GB parquet corpus
    python benchmarks/stream_memory.py --sizes 100,300        # a busy machine: smaller corpora
    python benchmarks/stream_memory.py --format jsonl --keep  # JSON lines; keep the corpora and caches

Each case writes a local corpus under `--dir` (documents of about 2 KB of sentences, deterministic), then runs
`posenc train data=hf data.data_files=[CORPUS] data.streaming=true data.max_tokens=N` with a budget above the
corpus's size (so the whole corpus is read into the token cache), a tiny model and a few steps. The training runs in
a fresh process started by a fresh process per case, which reads `resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`
after it: the peak resident memory of that one training process. The report gives, per case, the corpus size, the
tokens read, the peak RSS, the token cache's build rate (tokens/s, from the run's meta.json) and the wall time.
Target (issue #45): peak RSS under 1.5 GB and within 10% between the sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

DOC_SENTENCES = 24  # sentences per document: about 2 KB
ROWS_PER_GROUP = 5000  # parquet row group: about 10 MB of text


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sentences(n: int = 20_000, seed: int = 0) -> list[str]:
    """`n` pseudo-English sentences from a fixed word list (the same for every run)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 20))).capitalize() + "." for _ in range(n)]


def write_corpus(path: Path, megabytes: int, fmt: str) -> int:
    """Write about `megabytes` MB of documents to `path` (parquet or jsonl), in pieces; returns the text's bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pool = sentences()
    rng = random.Random(megabytes)
    target = megabytes * 1_000_000
    written = 0
    writer = pq.ParquetWriter(path, pa.schema([("text", pa.large_string())])) if fmt == "parquet" else None
    with contextlib.nullcontext() if writer is not None else open(path, "w", encoding="utf-8") as jsonl:
        while written < target:
            rows = [" ".join(rng.choices(pool, k=DOC_SENTENCES)) for _ in range(ROWS_PER_GROUP)]
            written += sum(len(r) for r in rows)  # ASCII: characters are bytes
            if writer is not None:
                writer.write_table(pa.table({"text": pa.array(rows, pa.large_string())}))
            else:
                jsonl.write("".join(json.dumps({"text": r}) + "\n" for r in rows))
    if writer is not None:
        writer.close()
    return written


def measure(argv: list[str]) -> None:
    """In a fresh process: run one training as a child, then print its peak RSS (bytes) as JSON."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        print(json.dumps({"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}))
        return
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    print(json.dumps({"peak_rss": peak_kib * 1024, "wall_s": round(wall, 1)}))


def run_case(corpus: Path, text_bytes: int, work: Path, steps: int) -> dict:
    run_dir = work / f"run-{corpus.stem}"
    shutil.rmtree(run_dir, ignore_errors=True)
    budget = 2 * text_bytes  # the byte tokenizer: a token per byte plus one per document, well under this
    argv = [
        sys.executable,
        "-m",
        "posenc_cli",
        "train",
        "--out",
        str(run_dir),
        "model=tiny",
        "pos=rope",
        "data=hf",
        f"data.data_files=[{corpus}]",
        "data.streaming=true",
        f"data.max_tokens={budget}",
        "data.val_fraction=0.01",
        f"data.cache_dir={work / 'cache'}",
        f"train.steps={steps}",
        "train.seq_len=64",
        "train.batch_size=4",
        "train.warmup_steps=1",
        "train.eval_every=1000000",
        "train.eval_batches=1",
        "train.save_every=1000000",
        "train.device=cpu",
        "train.threads=1",
    ]
    out = subprocess.run([sys.executable, __file__, "--measure", json.dumps(argv)], capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in result:
        raise SystemExit(f"{corpus.name}: training failed: {result['error']}")
    meta = json.loads((run_dir / "meta.json").read_text())
    data = meta.get("data") or {}
    tokens = sum((data.get("tokens") or {}).values())
    seconds = float(data.get("seconds") or 0.0)
    return {
        "corpus": corpus.name,
        "corpus_mb": round(corpus.stat().st_size / 1e6),
        "text_mb": round(text_bytes / 1e6),
        "tokens": tokens,
        "peak_rss_mb": round(result["peak_rss"] / 2**20),
        "cache_tokens_per_s": round(tokens / seconds) if seconds else None,
        "wall_s": result["wall_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="corpus sizes in MB of text, comma-separated")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/posenc-stream-bench"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the corpora, caches and runs")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(json.loads(args.measure))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for mb in (int(s) for s in args.sizes.split(",")):
        corpus = args.dir / f"corpus-{mb}MB.{args.format}"
        t0 = time.perf_counter()
        text_bytes = write_corpus(corpus, mb, args.format)
        print(f"wrote {corpus} ({corpus.stat().st_size / 1e6:.0f} MB on disk) in {time.perf_counter() - t0:.0f} s")
        rows.append(run_case(corpus, text_bytes, args.dir, args.steps))
        print(json.dumps(rows[-1]))
        if not args.keep:
            corpus.unlink()
            shutil.rmtree(args.dir / "cache", ignore_errors=True)
    print(f"\nCPU: {cpu_model()} ({os.cpu_count()} logical cores), Python {platform.python_version()}")
    print(f"{'corpus':<24}{'text MB':>9}{'tokens':>15}{'peak RSS MB':>13}{'cache tok/s':>13}{'wall s':>8}")
    for r in rows:
        print(
            f"{r['corpus']:<24}{r['text_mb']:>9}{r['tokens']:>15,}{r['peak_rss_mb']:>13}"
            f"{r['cache_tokens_per_s'] or 0:>13,}{r['wall_s']:>8}"
        )
    if len(rows) >= 2:
        peaks = [r["peak_rss_mb"] for r in rows]
        spread = (max(peaks) - min(peaks)) / min(peaks)
        print(f"peak RSS spread {spread:.1%} (target < 10%); largest {max(peaks)} MB (target < 1536 MB)")
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
