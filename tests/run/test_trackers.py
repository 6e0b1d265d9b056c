"""Trackers: TensorBoard event files read back with tensorboard's reader; W&B and MLflow offline when installed."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
from train_utils import metrics, tiny_config, write_corpus

from posenc_cli.config import Config, replace
from posenc_cli.errors import UserError
from posenc_cli.run.outcome import TrainResult
from posenc_cli.run.trackers import INSTALL_HINT, Tracker, combine, flat_config, make_tracker
from posenc_cli.run.train import train


def with_logger(cfg: Config, logger: str) -> Config:
    return replace(cfg, train=replace(cfg.train, logger=logger))


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return tiny_config(write_corpus(tmp_path), pos="rope")


def result(reason: str = "complete") -> TrainResult:
    return TrainResult(
        run_dir=Path("."), step=3, steps=3, tokens=0, train_loss=1.0, val_loss=1.0, val_ppl=math.e,
        best_val_loss=1.0, tokens_per_s=1.0, wall_time_s=1.0, precision="fp32", device="cpu", stopped_reason=reason,
    )  # fmt: skip


def feed(
    tracker: Tracker, losses: dict[int, float], *, start: int = 0, val: dict[int, float] | None = None, end: bool = True
) -> None:
    """start, one logged step event per entry of `losses`, eval events, end."""
    tracker({"event": "start", "step": start, "resumed": start > 0})
    for step, loss in losses.items():
        tracker({"event": "step", "step": step, "loss": loss, "lr": 1e-3, "grad_norm": 0.5, "tokens": 64 * step,
                 "tokens_per_s": 100.0, "interval_tokens_per_s": 90.0, "logged": True})  # fmt: skip
        if val and step in val:
            tracker({"event": "eval", "step": step, "val_loss": val[step]})
    if end:
        tracker({"event": "end", "result": result()})


def test_none_makes_no_tracker(cfg: Config, tmp_path: Path) -> None:
    assert make_tracker(cfg, tmp_path / "run") is None


def test_combine_calls_each_callback_in_order_and_skips_none() -> None:
    seen: list[tuple[str, Any]] = []
    call = combine(lambda e: seen.append(("a", e["event"])), None, lambda e: seen.append(("b", e["event"])))
    call({"event": "step"})
    assert seen == [("a", "step"), ("b", "step")]


def test_flat_config_has_dotted_scalar_keys(cfg: Config) -> None:
    flat = flat_config(cfg)
    assert flat["model.d_model"] == 32 and flat["pos.name"] == "rope" and flat["pos.scaling.method"] == "none"
    assert all(isinstance(v, bool | int | float | str) for v in flat.values())


# -- missing extras ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("logger", "module"), [("tensorboard", "torch.utils.tensorboard"), ("wandb", "wandb"),
                                                ("mlflow", "mlflow")])  # fmt: skip
def test_missing_extra_is_one_clear_error(
    cfg: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logger: str, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(UserError, match=r"pip install 'posenc\[trackers\]'") as info:
        make_tracker(with_logger(cfg, logger), tmp_path / "run")
    assert f"train.logger={logger}" in str(info.value) and INSTALL_HINT in str(info.value)
    assert not (tmp_path / "run").exists()


# -- the event adapter ---------------------------------------------------------------------------------------------


class Recorder(Tracker):
    name = "recorder"

    def __init__(self, *args: Any, fail_at: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []
        self.fail_at = fail_at

    def _open(self, step: int, resumed: bool) -> None:
        self.calls.append(("open", step, resumed))

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        if step == self.fail_at:
            raise ConnectionError("tracker server went away")
        self.calls.append(("log", step, sorted(scalars)))

    def _finish(self, status: str) -> None:
        self.calls.append(("finish", status))


def test_events_become_open_log_finish(cfg: Config, tmp_path: Path) -> None:
    rec = Recorder(cfg, tmp_path)
    rec({"event": "data", "stage": "read", "done": 1, "total": 2})  # ignored
    rec({"event": "step", "step": 1, "loss": 1.0, "logged": False})  # not logged: ignored
    feed(rec, {1: 2.0, 2: 1.5}, val={2: 1.7})
    rec.close()  # after `end`: nothing more
    steps = ["train/grad_norm", "train/loss", "train/lr", "train/tokens", "train/tokens_per_s"]
    assert rec.calls == [
        ("open", 0, False),
        ("log", 1, steps),
        ("log", 2, steps),
        ("log", 2, ["val/loss", "val/ppl"]),
        ("finish", "FINISHED"),
    ]


def test_close_without_end_marks_the_run_failed(cfg: Config, tmp_path: Path) -> None:
    rec = Recorder(cfg, tmp_path)
    rec({"event": "start", "step": 5, "resumed": True})
    rec.close()
    rec.close()
    assert rec.calls == [("open", 5, True), ("finish", "FAILED")]


def test_a_failing_tracker_is_switched_off_without_stopping_training(cfg: Config, tmp_path: Path) -> None:
    rec = Recorder(cfg, tmp_path, fail_at=2)
    with pytest.warns(UserWarning, match="switched off after an error: ConnectionError"):
        feed(rec, {1: 2.0, 2: 1.5, 3: 1.2})
    rec.close()
    assert rec.calls == [("open", 0, False), ("log", 1, rec.calls[1][2])]


# -- TensorBoard ---------------------------------------------------------------------------------------------------


def scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_logs_the_training_losses(cfg: Config, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="needs the tensorboard package (posenc[trackers])")
    cfg = with_logger(cfg, "tensorboard")
    run_dir = tmp_path / "run"
    tracker = make_tracker(cfg, run_dir)
    assert tracker is not None
    try:
        train(replace(cfg, train=replace(cfg.train, steps=6, log_every=2, eval_every=3)), run_dir, callback=tracker)
    finally:
        tracker.close()
    logged = metrics(run_dir, ("step", "train_loss", "val_loss"))
    tb_loss = scalars(run_dir / "tensorboard", "train/loss")
    assert [s for s, _ in tb_loss] == [s for s, _, _ in logged] == [2, 3, 4, 6]
    for (_, value), (_, expected, _) in zip(tb_loss, logged, strict=True):
        assert value == pytest.approx(expected, rel=1e-6)  # stored as float32
    tb_val = scalars(run_dir / "tensorboard", "val/loss")
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in tb_val] == [(s, v) for s, _, v in logged if v is not None]
    assert [s for s, _ in scalars(run_dir / "tensorboard", "train/lr")] == [2, 3, 4, 6]


def test_tensorboard_resume_drops_the_steps_logged_after_the_checkpoint(cfg: Config, tmp_path: Path) -> None:
    """A killed session logged steps 1..8 but its checkpoint is at 5: the resumed session's 6..10 replace them."""
    pytest.importorskip("tensorboard", reason="needs the tensorboard package (posenc[trackers])")
    cfg = with_logger(cfg, "tensorboard")
    first = make_tracker(cfg, tmp_path)
    assert first is not None
    first({"event": "start", "step": 0, "resumed": False})
    for step in range(1, 9):
        first({"event": "step", "step": step, "loss": 10.0 + step, "logged": True})
    first.close()
    second = make_tracker(cfg, tmp_path)
    assert second is not None
    feed(second, {step: float(step) for step in range(6, 11)}, start=5)
    second.close()
    got = scalars(tmp_path / "tensorboard", "train/loss")
    assert got == [(s, 10.0 + s) for s in range(1, 6)] + [(s, float(s)) for s in range(6, 11)]


# -- W&B and MLflow, offline ---------------------------------------------------------------------------------------


def test_wandb_offline_run(cfg: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (posenc[trackers])")
    for key in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    tracker = make_tracker(with_logger(cfg, "wandb"), tmp_path / "sweep" / "job", group="sweep-a", store=tmp_path)
    assert tracker is not None
    feed(tracker, {1: 2.0, 2: 1.5}, val={2: 1.75}, end=False)
    run = tracker.run  # type: ignore[attr-defined]
    assert run.settings.mode == "offline" and run.group == "sweep-a" and run.name == "job"
    assert run.summary["train/loss"] == 1.5 and run.summary["val/loss"] == 1.75 and run.summary["trainer/step"] == 2
    assert run.config["model"]["d_model"] == 32
    tracker({"event": "end", "result": result()})
    tracker.close()
    wandb.teardown()  # wait for W&B's writer process to flush the offline file
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, "offline mode by default: the run is a local file for `wandb sync`"
    assert b"train/loss" in files[0].read_bytes()


def test_mlflow_file_store_run(cfg: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed (posenc[trackers])")
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(key, raising=False)
    for job in ("job-1", "job-2"):  # two jobs of one sweep: two runs in the sweep's experiment
        tracker = make_tracker(with_logger(cfg, "mlflow"), tmp_path / job, group="sweep-a", store=tmp_path)
        assert tracker is not None
        feed(tracker, {1: 2.0, 2: 1.5}, val={2: 1.75})
        tracker.close()
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("sweep-a")
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in found) == ["job-1", "job-2"]
    run = found[0]
    assert run.info.status == "FINISHED" and run.data.params["model.d_model"] == "32"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 2.0), (2, 1.5)]
    assert run.data.metrics["val/loss"] == 1.75
