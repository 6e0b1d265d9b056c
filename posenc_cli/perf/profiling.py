"""Where a sweep's time goes: wall seconds per phase of every job, the model FLOPs each phase did, and the sweep's
account gathered from them (`profile.json` in each job directory and in the sweep directory).

Jobs may run in other processes (joblib workers, Slurm nodes), so each job writes its own `profile.json` and the
sweep's parent aggregates them from disk. Phases of a job come from the events `train()` already emits (`start`,
`eval` and `checkpoint` carry their own duration in `seconds`) and from evaluation's progress calls:

  setup        data, model and optimizer (train() up to its `start` event, less the first save)
  steps        the training updates themselves (forward, backward, optimizer)
  validation   the periodic validation loss
  checkpoints  atomic saves
  extend       deriving an extended run (RoPE scaling; its fine-tune counts as setup/steps/... above)
  eval load    loading the run for evaluation
  eval L=<n>   perplexity at n tokens

FLOPs use the same model-FLOPs convention as `posenc bench` (Kaplan et al. 2020; PaLM App. B), for N parameters
and a causal context of T tokens: 6·N + 6·n_layer·d_model·T per trained token, 2·N + 2·n_layer·d_model·T per
evaluated token (the forward third). Efficiency divides a phase's FLOP/s by a matmul peak measured once with the
same dtype and thread count (`bench.matmul_gflops`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posenc_cli.fsutil import atomic_write_json
from posenc_cli.perf.bench import DTYPES, matmul_gflops, matmul_size
from posenc_cli.run.device import threads as use_threads

PROFILE_FILE = "profile.json"
SCHEMA_VERSION = 1
TRAIN_PHASES = ("setup", "steps", "validation", "checkpoints")

Event = dict[str, Any]
Callback = Callable[[Event], None]


def train_flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """6·N + 6·n_layer·d_model·T: forward and backward of a causal decoder (see the module docstring)."""
    return 6.0 * n_params + 6.0 * n_layer * d_model * seq_len


def forward_flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """2·N + 2·n_layer·d_model·T: the forward pass alone (a third of training's)."""
    return 2.0 * n_params + 2.0 * n_layer * d_model * seq_len


@dataclass
class JobProfile:
    """Wall seconds and model FLOPs per phase of one job, with what is needed to turn them into efficiency."""

    seconds: dict[str, float] = field(default_factory=dict)
    flops: dict[str, float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # precision, threads, device, n_params

    def add(self, phase: str, seconds: float, flops: float = 0.0) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, seconds)
        if flops:
            self.flops[phase] = self.flops.get(phase, 0.0) + flops

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
            "flops": self.flops,
            **self.facts,
        }


class TrainRecorder:
    """A `train()` callback that books its events into a `JobProfile` and passes every event on to `inner`.

    Use it around one `train()` call: `with recorder.session(): train(..., callback=recorder)`. Step time is the sum
    of the updates' own durations (`TrainResult.tokens_per_s` is session tokens over exactly that sum).
    """

    def __init__(self, profile: JobProfile, cfg: Any, inner: Callback | None = None) -> None:
        self.profile, self.model, self.inner = profile, cfg.model, inner
        self.seq_len = cfg.train.seq_len  # a fine-tune's own length arrives with its `start` event
        self.val_rows = cfg.train.eval_batches * cfg.train.batch_size  # windows read per validation
        self._start = time.perf_counter()
        self._before_start = 0.0  # saves made before the `start` event (a fresh run's first checkpoint)
        self._started: Event | None = None

    def __call__(self, event: Event) -> None:
        kind = event.get("event")
        if kind == "start":
            self._started = event
            self.seq_len = int(event.get("seq_len") or self.seq_len)
            self.profile.add("setup", time.perf_counter() - self._start - self._before_start)
            device = str(event.get("device") or "cpu")
            self.profile.facts.update(
                precision=event.get("precision"),
                threads=event.get("threads"),
                device=device,
                n_params=event.get("n_params"),
                peak_key=peak_key(str(event.get("precision")), int(event.get("threads") or 0), device),
            )
        elif kind == "checkpoint" and "seconds" in event:
            if self._started is None:
                self._before_start += float(event["seconds"])
            self.profile.add("checkpoints", float(event["seconds"]))
        elif kind == "eval" and "seconds" in event:
            self.profile.add("validation", float(event["seconds"]), self._validation_flops(event))
        elif kind == "end" and self._started is not None:
            self._book_steps(event["result"])
        if self.inner is not None:
            self.inner(event)

    def _validation_flops(self, event: Event) -> float:
        n = int(self._started.get("n_params") or 0) if self._started else 0
        per_token = forward_flops_per_token(n, self.model.n_layer, self.model.d_model, self.seq_len)
        return self.val_rows * self.seq_len * per_token

    def _book_steps(self, result: Any) -> None:
        assert self._started is not None
        steps = int(result.step) - int(self._started["step"])
        tokens = steps * int(self._started["tokens_per_step"])
        if steps <= 0 or not result.tokens_per_s:
            return
        n = int(self._started["n_params"])
        flops = tokens * train_flops_per_token(n, self.model.n_layer, self.model.d_model, self.seq_len)  # pads too
        # tokens/s counts input tokens without padding (`train.packing=none` pads rows), so the time is the session's
        # real tokens over it; a start event without its token count (every row full) counts whole steps
        real = tokens
        if "tokens" in self._started and getattr(result, "tokens", None) is not None:
            real = int(result.tokens) - int(self._started["tokens"])
        self.profile.add("steps", real / float(result.tokens_per_s), flops)


class EvalRecorder:
    """An evaluation `progress(description, done, total)` callback that books each length's wall time.

    `evaluate_model` reports "L=<n>" after every batch; a length's time runs from the previous length's last report
    (or `start()`) to its own last one, so it includes storing the previous cell.
    """

    def __init__(self, profile: JobProfile, run: Any) -> None:
        self.profile, self.run = profile, run  # a `LoadedRun`: its model config and parameter count give the FLOPs
        self._mark = time.perf_counter()
        self._lengths: dict[str, tuple[int, int]] = {}  # description -> (batches done, total)

    def start(self) -> None:
        self._mark = time.perf_counter()

    def __call__(self, description: str, done: int, total: int) -> None:
        now = time.perf_counter()
        self.profile.add(f"eval {description}", now - self._mark)
        self._mark = now

    def book_flops(self, entries: list[dict[str, Any]]) -> None:
        """FLOPs of the measured (not reused) entries: windows × L tokens read, each 2·N + 2·n_layer·d·L."""
        if not entries:
            return
        model, n_params = self.run.config.model, sum(p.numel() for p in self.run.model.parameters())
        for entry in entries:
            phase = f"eval L={entry.get('length')}"
            if entry.get("status") != "ok" or phase not in self.profile.seconds:
                continue
            length = int(entry["length"])
            stride = int(entry.get("stride") or length)
            read = int(entry["tokens"]) // stride * length
            per_token = forward_flops_per_token(n_params, model.n_layer, model.d_model, length)
            self.profile.add(phase, 0.0, read * per_token)


def eval_facts(profile: JobProfile, entries: list[dict[str, Any]], device: Any) -> None:
    """Dtype, threads and device of a job that only evaluated (an extension without fine-tune)."""
    if "peak_key" in profile.facts or not entries:
        return
    precision, n = str(entries[0].get("dtype") or "fp32"), torch.get_num_threads()
    profile.facts.update(precision=precision, threads=n, device=str(device))
    profile.facts["peak_key"] = peak_key(precision, n, str(device))


def write_job_profile(job_dir: Path, profile: JobProfile, wall_s: float) -> None:
    atomic_write_json(Path(job_dir) / PROFILE_FILE, profile.to_dict() | {"wall_s": round(wall_s, 4)})


def read_profile(path: Path) -> dict[str, Any] | None:
    """A profile.json, or None when it is missing or unreadable (a profile is informative, never required)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema_version") == SCHEMA_VERSION else None


# ----------------------------------------------------------------------------------------------------------------
# The sweep's account.


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), i.e. interpreter start-up and imports before `now`."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of proc(5), counted after the command name
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return max(0.0, time.time() - (boot + start_ticks / os.sysconf("SC_CLK_TCK")))


def aggregate(
    sweep_dir: Path,
    job_dirs: list[tuple[str, Path]],
    parent: dict[str, float],
    stages: list[dict[str, Any]],
    peaks: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The sweep's profile: the parent's own phases, each stage's wall time, and per phase the seconds and FLOPs
    summed over the jobs' profile.json files (jobs without one are listed as missing), with FLOP/s and efficiency
    against `peaks` ({"<dtype>@<threads>": GFLOP/s}) where the jobs' dtype and thread count have a peak."""
    phases: dict[str, dict[str, float]] = {}
    jobs, missing = [], []
    for stage, job_dir in job_dirs:
        doc = read_profile(job_dir / PROFILE_FILE)
        rel = str(job_dir.relative_to(sweep_dir)) if job_dir.is_relative_to(sweep_dir) else str(job_dir)
        if doc is None:
            missing.append(rel)
            continue
        key = str(doc.get("peak_key") or "")
        jobs.append({"dir": rel, "stage": stage, "peak_key": key, **{k: doc.get(k) for k in ("wall_s", "seconds")}})
        for name, seconds in (doc.get("seconds") or {}).items():
            row = phases.setdefault(name, {"seconds": 0.0, "flops": 0.0, "peak_s": 0.0})
            row["seconds"] += float(seconds)
            flops = float((doc.get("flops") or {}).get(name, 0.0))
            row["flops"] += flops
            peak = (peaks or {}).get(key)
            if peak and flops:
                row["peak_s"] += flops / (peak * 1e9)  # seconds this phase would take at the peak
    for row in phases.values():
        row["gflops_per_s"] = row["flops"] / row["seconds"] / 1e9 if row["flops"] and row["seconds"] else None
        row["efficiency"] = row.pop("peak_s") / row["seconds"] if peaks and row["flops"] and row["seconds"] else None
    return {
        "schema_version": SCHEMA_VERSION,
        "parent": {k: round(v, 4) for k, v in parent.items()},
        "stages": stages,
        "phases": phases,
        "jobs": jobs,
        "missing": missing,
        "peak_gflops": peaks,
        "cpu": cpu_model(),
    }


def peak_key(precision: str, threads: int, device: str = "cpu") -> str:
    """Which peak a job's FLOP/s is measured against: "<dtype>@<threads>" on CPU, "<dtype>@cuda" on a GPU."""
    return f"{precision}@cuda" if device.startswith("cuda") else f"{precision}@{threads}"


def machine_peak_key(job_key: str) -> str:
    """The whole machine's peak for a job's `peak_key`: the GPU's own on CUDA, every CPU thread in its dtype on CPU."""
    precision, _, where = job_key.partition("@")
    return job_key if where == "cuda" else peak_key(precision, torch.get_num_threads())


def measure_peaks(keys: set[str]) -> dict[str, float]:
    """Matmul GFLOP/s per `peak_key`, with `posenc bench`'s probe (a·bᵀ, best of 3; at most 2048² on CPU)."""
    peaks = {}
    for key in sorted(keys):
        precision, _, where = key.partition("@")
        dtype = DTYPES.get(precision)
        if dtype is None or (where == "cuda" and not torch.cuda.is_available()):
            continue
        device = torch.device("cuda" if where == "cuda" else "cpu")
        with use_threads(0 if where == "cuda" else int(where or 0)):
            size = matmul_size(dtype, device, min_seconds=0.1, max_size=2048 if device.type == "cpu" else None)
            peaks[key] = round(matmul_gflops(size, dtype, device), 2)
    return peaks


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


class StageClock:
    """A `run_sweep(on_event=...)` wrapper that times each launched stage: from its "run" event to the next event
    (or `finish()`), and everything before the first event as "plan" (composing and validating the jobs)."""

    def __init__(self, inner: Callable[[str, str], None] | None = None) -> None:
        self.inner = inner
        self.start = time.perf_counter()
        self.plan_s: float | None = None
        self.stages: list[dict[str, Any]] = []
        self._open: tuple[str, float] | None = None

    def __call__(self, kind: str, text: str) -> None:
        now = time.perf_counter()
        if self.plan_s is None:
            self.plan_s = now - self.start
        self._close(now)
        if kind == "run":
            self._open = (text.split(":", 1)[0], now)
        if self.inner is not None:
            self.inner(kind, text)

    def finish(self) -> float:
        """Close the last stage; returns the seconds since the clock started."""
        now = time.perf_counter()
        if self.plan_s is None:
            self.plan_s = now - self.start
        self._close(now)
        return now - self.start

    def _close(self, now: float) -> None:
        if self._open is not None:
            self.stages.append({"stage": self._open[0], "wall_s": round(now - self._open[1], 4)})
            self._open = None


def summary_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The profile as table rows (phase, seconds, share of the jobs' time, GFLOP, GFLOP/s, efficiency), the jobs'
    phases first in a fixed order (evaluation lengths by length), then the sweep's own (start-up, plan, report)."""
    phases = doc.get("phases") or {}
    total = sum(float(row["seconds"]) for row in phases.values()) or 1.0

    def order(name: str) -> tuple[int, int, str]:
        fixed = [*TRAIN_PHASES, "extend", "eval load"]
        if name in fixed:
            return (0, fixed.index(name), name)
        if name.startswith("eval L="):
            return (1, int(name.split("=", 1)[1]) if name.split("=", 1)[1].isdigit() else 0, name)
        return (2, 0, name)

    rows = []
    for name in sorted(phases, key=order):
        row = phases[name]
        rows.append(
            {
                "phase": name,
                "seconds": float(row["seconds"]),
                "share": float(row["seconds"]) / total,
                "gflop": float(row["flops"]) / 1e9 if row.get("flops") else None,
                "gflops_per_s": row.get("gflops_per_s"),
                "efficiency": row.get("efficiency"),
            }
        )
    return rows


def write_sweep_profile(
    sweep_dir: Path, plans: list[Any], clock: StageClock, parent: dict[str, float], *, measure_peak: bool = False
) -> dict[str, Any]:
    """Aggregate the jobs of `plans` into `<sweep_dir>/profile.json` (written atomically) and return it.

    `parent`: the sweep process's own phases (e.g. "start-up", "report"); "plan" comes from the clock. With
    `measure_peak`, the matmul peak of every dtype and thread count the jobs used (and of the whole machine in
    the jobs' dtype) is measured now, so each phase gets an efficiency.
    """
    sweep_dir = Path(sweep_dir).resolve()
    job_dirs = [(plan.stage.name, job.dir(sweep_dir)) for plan in plans for job in plan.jobs]
    own = {"plan": clock.plan_s or 0.0, **parent}
    doc = aggregate(sweep_dir, job_dirs, own, clock.stages)
    machine = {machine_peak_key(str(j["peak_key"])) for j in doc["jobs"] if j.get("peak_key")}
    if measure_peak:
        peaks = measure_peaks({str(j["peak_key"]) for j in doc["jobs"] if j.get("peak_key")} | machine)
        doc = aggregate(sweep_dir, job_dirs, own, clock.stages, peaks)
    flops = sum(float(row["flops"]) for row in doc["phases"].values())
    wall = sum(own.values()) + sum(float(s["wall_s"]) for s in clock.stages)
    doc["total"] = {"wall_s": round(wall, 4), "flops": flops, "gflops_per_s": flops / wall / 1e9 if wall else None}
    if len(machine) == 1 and doc.get("peak_gflops"):
        peak = doc["peak_gflops"].get(next(iter(machine)))
        doc["total"]["machine_peak_key"] = next(iter(machine))
        doc["total"]["efficiency"] = flops / wall / (peak * 1e9) if peak and wall else None
    atomic_write_json(sweep_dir / PROFILE_FILE, doc)
    return doc
