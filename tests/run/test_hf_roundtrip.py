"""Round trip: `posenc export RUN --to hf`, then `eval-extrapolate` on the export equals it on the run (1e-4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

pytest.importorskip("transformers")

from posenc_cli.cli import app
from posenc_cli.config import ExtendConfig
from posenc_cli.extension.extend import extend_run
from posenc_cli.run.export import export_run
from posenc_cli.run.train import train

runner = CliRunner()
Pairs = tuple[Path, list[tuple[Path, Path]]]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Pairs:
    """(corpus, [(posenc run, its transformers export)]) for a learned, a RoPE and a YaRN-extended RoPE run."""
    root = tmp_path_factory.mktemp("roundtrip")
    corpus = write_corpus(root)
    runs = {}
    for pos in ("learned", "rope"):
        runs[pos] = root / pos
        train(tiny_config(corpus, pos=pos, steps=6), runs[pos])
    runs["rope-yarn"] = root / "rope-yarn"
    extend_run(runs["rope"], runs["rope-yarn"], ExtendConfig(method="yarn", factor=4))
    out = []
    for name, run in runs.items():
        export_run(run, root / f"hf-{name}")
        out.append((run, root / f"hf-{name}"))
    return corpus, out


def test_export_then_eval_gives_the_runs_perplexity(pairs: Pairs, tmp_path: Path) -> None:
    corpus, runs = pairs
    json_out = tmp_path / "all.json"
    paths = [str(p) for pair in runs for p in pair]
    data = ["data=text", f"data.paths=[{corpus}]", "data.val_fraction=0.1"]
    result = runner.invoke(
        app, ["eval-extrapolate", *paths, "--lengths", "1,4", "--tokens", "512", "--json", str(json_out), *data]
    )
    assert result.exit_code == 0, result.output
    docs = {Path(d["path"]).name: d for d in json.loads(json_out.read_text())["runs"]}
    for run, export in runs:
        ours, theirs = docs[run.name], docs[export.name]
        assert theirs["scheme"] == ours["scheme"] and theirs["base_length"] == ours["base_length"] == 16
        for a, b in zip(ours["entries"], theirs["entries"], strict=True):
            assert (a["length"], a["status"], a["tokens"]) == (b["length"], b["status"], b["tokens"])
            if a["status"] == "ok":
                assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-4)
                assert b["bpb"] == pytest.approx(a["bpb"], rel=1e-4)
        statuses = [e["status"] for e in theirs["entries"]]
        assert statuses == (["ok", "n/a"] if ours["scheme"] == "learned" else ["ok", "ok"])
