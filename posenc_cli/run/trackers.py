"""Experiment trackers (`train.logger=none|tensorboard|wandb|mlflow`): callbacks over `train()`'s events.

`metrics.jsonl` is always written by `train()`; a tracker mirrors the same numbers into TensorBoard, Weights &
Biases or MLflow through that library (the optional extra `posenc[trackers]`). Events (see `posenc_cli.run.train`):
`start` opens the tracker's run and records the config; `step` events with `logged=True` (every `train.log_every`
steps, as metrics.jsonl) log train/loss, train/lr, train/grad_norm, train/tokens and train/tokens_per_s; `eval`
logs val/loss and val/ppl; `end` records the final numbers and closes the run. `close()` (call it in a `finally`)
closes a run that never saw `end` and marks it failed. A tracker that fails while logging is switched off with a
warning rather than stopping the training.

Offline by default: TensorBoard writes `<run>/tensorboard/`; W&B runs in offline mode unless WANDB_MODE is set
(files under `<store>/wandb/`, `wandb sync` uploads them later); MLflow logs to a file store `<store>/mlruns`
unless MLFLOW_TRACKING_URI is set (MLflow 3 wants MLFLOW_ALLOW_FILE_STORE=true for it; posenc sets that default).
`store` defaults to the run directory; a sweep passes its own directory and its name as `group`, so every job is
its own run, grouped (W&B group, MLflow experiment, one TensorBoard log dir above the jobs' directories).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posenc_cli.config import Config, config_to_dict, config_to_yaml
from posenc_cli.errors import UserError

__all__ = ["TRACKERS", "Tracker", "combine", "flat_config", "make_tracker"]

Callback = Callable[[dict[str, Any]], None]
INSTALL_HINT = "pip install 'posenc[trackers]'"
TENSORBOARD_DIR = "tensorboard"


class Tracker:
    """Base adapter: turns events into `_open` / `_log(step, scalars)` / `_finish(status)` calls of a backend."""

    name = "none"

    def __init__(self, cfg: Config, run_dir: Path, *, group: str | None = None, store: Path | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.group = group
        self.store = Path(store) if store is not None else self.run_dir
        self.opened = False
        self.closed = False
        self.failed = False  # switched off after an error

    # -- the callback --------------------------------------------------------------------------------------------
    def __call__(self, event: dict[str, Any]) -> None:
        if self.closed or self.failed:
            return
        kind = event.get("event")
        if kind == "start" and not self.opened:
            try:
                self._open(step=int(event.get("step", 0)), resumed=bool(event.get("resumed", False)))
            except ImportError as e:
                raise UserError(f"train.logger={self.name} needs its package: {INSTALL_HINT} ({e})") from e
            except Exception as e:
                raise UserError(f"train.logger={self.name}: could not start the run ({type(e).__name__}: {e})") from e
            self.opened = True
            return
        if not self.opened:
            return
        with self._guard():
            if kind == "step" and event.get("logged"):
                self._log(int(event["step"]), step_scalars(event))
            elif kind == "eval" and event.get("val_loss") is not None:
                self._log(int(event["step"]), val_scalars(float(event["val_loss"])))
            elif kind == "end":
                result = event.get("result")
                status = getattr(result, "stopped_reason", "complete")
                self._finish("FINISHED" if status in ("complete", "already_complete") else "KILLED")
                self.closed = True

    def close(self) -> None:
        """Close the run (idempotent). A run that never saw `end` (an exception, a divergence) is marked FAILED."""
        if self.closed:
            return
        self.closed = True
        if self.opened and not self.failed:
            with self._guard():
                self._finish("FAILED")

    @contextlib.contextmanager
    def _guard(self) -> Any:
        try:
            yield
        except Exception as e:  # never let a tracker stop the training
            self.failed = True
            warnings.warn(
                f"train.logger={self.name} switched off after an error: {type(e).__name__}: {e}", stacklevel=3
            )

    # -- backends ------------------------------------------------------------------------------------------------
    def _open(self, step: int, resumed: bool) -> None:
        raise NotImplementedError

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def _finish(self, status: str) -> None:
        raise NotImplementedError


def step_scalars(event: dict[str, Any]) -> dict[str, float]:
    keys = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens": "train/tokens"}
    out = {name: float(event[k]) for k, name in keys.items() if event.get(k) is not None}
    if event.get("interval_tokens_per_s") is not None:
        out["train/tokens_per_s"] = float(event["interval_tokens_per_s"])
    return out


def val_scalars(val_loss: float) -> dict[str, float]:
    out = {"val/loss": val_loss}
    if math.isfinite(val_loss) and val_loss < 700:
        out["val/ppl"] = math.exp(val_loss)
    return out


def flat_config(cfg: Config) -> dict[str, str | int | float | bool]:
    """The config as dotted keys with scalar values (lists and None as strings), e.g. {"model.d_model": 128}."""
    out: dict[str, str | int | float | bool] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, bool | int | float | str):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    walk("", config_to_dict(cfg))
    return out


# ----------------------------------------------------------------------------------------------------------------
# TensorBoard (torch.utils.tensorboard; needs the `tensorboard` package).


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # deferred: keeps tensorboard off posenc --help start-up
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the `tensorboard` package

        self._writer_cls = SummaryWriter
        self.writer: Any = None
        self.last: dict[str, float] = {}

    def _open(self, step: int, resumed: bool) -> None:
        # A resumed run continues from its checkpoint: steps after it logged by the killed session are purged.
        purge = step + 1 if resumed else None
        self.writer = self._writer_cls(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=purge)
        self.writer.add_text("config", "```\n" + config_to_yaml(self.cfg) + "```", global_step=step)

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.last.update(scalars)

    def _finish(self, status: str) -> None:
        if status == "FINISHED":
            final = {f"final/{k}": v for k, v in self.last.items() if k in ("train/loss", "val/loss")}
            self.writer.add_hparams(flat_config(self.cfg), final or {"final/none": 0.0}, run_name=".")
        self.writer.close()


# ----------------------------------------------------------------------------------------------------------------
# Weights & Biases (offline unless WANDB_MODE says otherwise).


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # deferred: keeps wandb off posenc --help start-up
        import wandb  # ImportError without the extra

        self.wandb = wandb
        self.run: Any = None

    def _open(self, step: int, resumed: bool) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        run_id = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:16]  # stable: a resume continues it
        self.run = self.wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "posenc",
            name=self.run_dir.name,
            group=self.group,
            dir=str(self.store),
            id=run_id,
            resume="allow",
            config=config_to_dict(self.cfg),
            mode=os.environ.get("WANDB_MODE") or "offline",
            settings=self.wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric("*", step_metric="trainer/step")

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log({"trainer/step": step, **scalars})

    def _finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


# ----------------------------------------------------------------------------------------------------------------
# MLflow (a local file store unless MLFLOW_TRACKING_URI is set).


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # deferred: keeps mlflow off posenc --help start-up
        import mlflow  # ImportError without the extra

        self.mlflow = mlflow
        self.client: Any = None
        self.run_id: str | None = None

    @property
    def tracking_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or (self.store / "mlruns").resolve().as_uri()

    def _allow_file_store(self) -> None:
        """MLflow >= 3.x refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true; posenc's default is one (a
        database store would need SQLAlchemy and serialise parallel sweep jobs on one file)."""
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

    @property
    def experiment_name(self) -> str:
        return self.group or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "posenc"

    def _experiment_id(self) -> str:
        name = self.experiment_name
        for _attempt in range(3):  # parallel sweep jobs may race to create the experiment
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                return str(experiment.experiment_id)
            with contextlib.suppress(self.mlflow.exceptions.MlflowException):
                return str(self.client.create_experiment(name))
        raise RuntimeError(f"could not create or find MLflow experiment '{name}'")

    def _open(self, step: int, resumed: bool) -> None:
        # deferred: keeps mlflow off posenc --help start-up
        from mlflow.entities import Param

        self._allow_file_store()
        self.client = self.mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        tags = {"posenc.run_dir": str(self.run_dir.resolve()), "posenc.start_step": str(step)}
        if self.group:
            tags["posenc.group"] = self.group
        run = self.client.create_run(self._experiment_id(), run_name=self.run_dir.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:500]) for k, v in flat_config(self.cfg).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        # deferred: keeps mlflow off posenc --help start-up
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars.items() if math.isfinite(v)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def _finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


# ----------------------------------------------------------------------------------------------------------------
# Construction.

TRACKERS: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


def make_tracker(
    cfg: Config, run_dir: Path | str, *, group: str | None = None, store: Path | str | None = None
) -> Tracker | None:
    """The tracker of `cfg.train.logger` for run `run_dir` (None for `none`); call `.close()` when training ends.

    `group`: a sweep's name (W&B group, MLflow experiment); `store`: where local tracker files go (W&B offline
    runs, the MLflow file store), default `run_dir`. Raises `UserError` naming the extra when its library is
    missing, before anything is trained.
    """
    name = cfg.train.logger
    if name == "none":
        return None
    try:
        return TRACKERS[name](cfg, Path(run_dir), group=group, store=Path(store) if store is not None else None)
    except ImportError as e:
        package = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny (or mlflow)"}[name]
        raise UserError(f"train.logger={name} needs the '{package}' package: {INSTALL_HINT}") from e


def combine(*callbacks: Callback | None) -> Callback:
    """One callback calling each given one in order (None entries are skipped)."""
    active = [c for c in callbacks if c is not None]

    def call(event: dict[str, Any]) -> None:
        for c in active:
            c(event)

    return call


@contextlib.contextmanager
def tracked(
    callback: Callback | None,
    cfg: Config,
    run_dir: Path | str,
    *,
    group: str | None = None,
    store: Path | str | None = None,
) -> Iterator[Callback]:
    """`callback` plus the configured tracker, closed when the block ends (a run that never ended is marked so)."""
    tracker = make_tracker(cfg, run_dir, group=group, store=store)
    try:
        yield combine(callback, tracker)
    finally:
        if tracker is not None:
            tracker.close()
