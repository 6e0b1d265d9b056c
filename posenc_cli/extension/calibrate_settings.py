"""What `posenc calibrate` may be asked, and the refusals that need no checkpoint: none of it imports torch.

`api.calibrate` runs `check_calibrate` before it imports `extension.calibrate` (and torch), so a user error is one
line within a second: a parent that does not exist, is a transformers directory, is not a posenc run or did not
finish training (`extension.settings.check_parent`), already has a temperature (its config.yaml, read only when it
matches meta.json's checksum), bad settings (`CalibrateSettings.validate`, the fit lengths) and an output directory
that is the parent. `calibrate_run` starts with the same check, so called directly it refuses alike; what needs the
model (the scheme's longest length, memory) is checked there once the parent is loaded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posenc_cli.bounds import MAX_BATCH, MAX_LR, MAX_STEPS, MAX_TOKENS, check
from posenc_cli.config import TEMPERATURE_FORMS, TemperatureForm
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.extension.settings import check_parent
from posenc_cli.run.journal import committed_file, sha256_bytes
from posenc_cli.run.layout import CONFIG_FILE, MAX_SMALL_FILE
from posenc_cli.run.meta import is_whole_number, read_meta
from posenc_cli.untrusted import loads_yaml, read_bytes

__all__ = [
    "FITTED",
    "CalibrateSettings",
    "c_grid",
    "check_calibrate",
    "check_no_temperature",
    "default_out_dir",
    "fit_lengths",
]

FITTED = ("drope", "head-scale")  # the temperatures this command fits
MAX_FIT_MULTIPLE = 1024  # a fit length at most 1024 training lengths (DroPE fits at 2-8x)

_SETTING_BOUNDS = (
    ("step", 1e-6, 100.0, False),
    ("c_min", -100.0, 100.0, False),
    ("c_max", -100.0, 100.0, False),
    ("refine", 0, 1000, True),
    ("steps", 1, MAX_STEPS, True),
    ("lr", 0.0, MAX_LR, False),
    ("init", 0.0, 1e3, False),
    ("batch_size", 1, MAX_BATCH, True),
)


@dataclass(frozen=True)
class CalibrateSettings:
    """What to fit and how. `lengths`: the fit lengths, in tokens or as '4x' (`fit_lengths`; each beyond the
    training length L; head-scale: one).
    `tokens`: tokens scored per length (windows from the start of `split`). drope: `step`, `c_min`, `c_max`,
    `refine` and `form` (`cell` or `query`, `temperatures.drope`). head-scale: `steps`, `lr`, `init`, `batch_size`."""

    temperature: Literal["drope", "head-scale"]
    lengths: tuple[int | str, ...]
    tokens: int = 8192
    split: Literal["train", "val"] = "train"
    step: float = 0.1
    c_min: float = -0.5
    c_max: float = 2.0
    refine: int = 10
    form: TemperatureForm = "cell"
    steps: int = 200
    lr: float = 0.05
    init: float = 1.0
    batch_size: int = 4

    def validate(self, train_length: int) -> None:
        """One line for a setting out of range; `lengths` in tokens (`fit_lengths`), each beyond `train_length`."""
        if self.temperature not in FITTED:
            raise ConfigError(f"--temperature {self.temperature}: calibrate fits {' or '.join(FITTED)}")
        if self.split not in ("train", "val"):
            raise ConfigError(f"--split {self.split}: the fit reads the run's train or val split")
        if not self.lengths:
            raise ConfigError("give a fit length: --length 4x (a multiple of the training length) or tokens")
        for n in self.lengths:
            if not isinstance(n, int) or n <= train_length:
                raise ConfigError(f"--length {n}: the fit length must exceed the training length {train_length}")
        check(self.tokens, "--tokens", 1, MAX_TOKENS, integer=True)
        for name, low, high, integer in _SETTING_BOUNDS:  # the CLI's ranges (api/option_ranges.py), for API callers too
            check(getattr(self, name), f"--{name.replace('_', '-')}", low, high, integer=integer)
        if self.temperature == "drope":
            if not (self.step > 0 and self.c_max - self.c_min >= self.step):
                raise ConfigError(
                    f"--step {self.step}, --c-min {self.c_min} and --c-max {self.c_max}: need 0 < step <= c-max - c-min"
                )
            if self.form not in TEMPERATURE_FORMS:
                raise ConfigError(f"--form {self.form}: DroPE's temperature is applied per cell or per query")
            if self.refine < 0:
                raise ConfigError(f"--refine must be >= 0, got {self.refine}")
            longest = max(int(n) for n in self.lengths) / train_length
            if not c_grid(self.step, self.c_min, self.c_max, longest):
                raise ConfigError(f"--c-min {self.c_min} .. --c-max {self.c_max}: no c keeps β > 0 at the fit length")
        else:
            if len(self.lengths) != 1:
                raise ConfigError("head-scale is trained at one length: give --length once")
            if self.steps < 1 or self.batch_size < 1:
                raise ConfigError("--steps and --batch-size must be >= 1")
            if not (self.lr > 0 and self.init > 0):
                raise ConfigError(f"--lr {self.lr} and --init {self.init} must be > 0")

    def record(self) -> dict[str, Any]:
        """The settings that decide the fit (the child's identity), without the other entry's."""
        drope = ("step", "c_min", "c_max", "refine", "form")
        keep = drope if self.temperature == "drope" else ("steps", "lr", "init", "batch_size")
        own = {k: getattr(self, k) for k in keep}
        return {
            "temperature": self.temperature,
            "lengths": list(self.lengths),
            "tokens": self.tokens,
            "split": self.split,
            **own,
        }


def fit_lengths(values: Sequence[str | int | float], train_length: int) -> tuple[int, ...]:
    """Fit lengths in tokens from '4x' (a multiple of the training length L, rounded) or a token count ('256')."""
    out = []
    for v in values:
        text = str(v).strip().lower()
        try:
            n = round(float(text[:-1]) * train_length) if text.endswith("x") else int(text)
        except (ValueError, OverflowError):  # OverflowError: 'infx'
            raise ConfigError(f"--length {v}: give a multiple of the training length (4x) or tokens (256)") from None
        longest = min(MAX_TOKENS, MAX_FIT_MULTIPLE * train_length)
        if n > longest:  # before anything is sized from it (`validate` holds the lower end)
            raise ConfigError(
                f"--length {v}: at most {longest} tokens ({MAX_FIT_MULTIPLE}x the training length {train_length})"
            )
        out.append(n)
    return tuple(dict.fromkeys(out))


def default_out_dir(parent_dir: Path | str, temperature: str, lengths: Sequence[Any], train_length: int) -> Path:
    """<RUN>-<temperature>x<s> beside the run, s the largest fit length over L ('nope-dropex4')."""
    parent = Path(parent_dir)
    s = max(lengths) / train_length
    return parent.with_name(f"{parent.name}-{temperature}x{s:g}")


def c_grid(step: float, c_min: float, c_max: float, longest: float) -> list[float]:
    """The multiples of `step` in [c_min, c_max] (rounded to 4 decimals) at which β = 1 + c·ln s stays > 0 at the
    longest fit length's s = `longest` (> 1)."""
    floor = -1.0 / math.log(longest)  # β(s) = 0 there
    low, high = math.ceil(c_min / step - 1e-9), math.floor(c_max / step + 1e-9)
    return [c for k in range(low, high + 1) if (c := round(k * step, 4)) > floor]


def check_no_temperature(parent_dir: Path, attn_scale: object) -> None:
    """Refuse a parent whose config already applies a temperature (`model.attn_scale` other than none)."""
    if isinstance(attn_scale, str) and attn_scale != "none":
        raise ConfigError(f"{parent_dir} already has a temperature (model.attn_scale={attn_scale})")


def check_calibrate(parent_dir: Path | str, settings: CalibrateSettings, out_dir: Path | str | None = None) -> None:
    """One line, reading only meta.json and config.yaml, for what the module doc lists. A config.yaml that does
    not match its checksum, or a run that records no training length, is left to `load_run` to judge."""
    parent = Path(parent_dir)
    if check_parent(parent, None if out_dir is None else Path(out_dir)):
        raise ConfigError(f"{parent} is a transformers directory; calibrate fits posenc runs")
    meta = read_meta(parent)
    model, train = _saved_groups(parent, meta)
    check_no_temperature(parent, model.get("attn_scale", "none"))
    train_length = meta.get("train_length") or train.get("seq_len")  # as `RunMeta.lengths` derives it
    if is_whole_number(train_length) and train_length > 0:
        lengths = fit_lengths(settings.lengths, train_length)
        dataclasses.replace(settings, lengths=lengths).validate(train_length)


def _saved_groups(run_dir: Path, meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `model` and `train` mappings of the run's config.yaml when its bytes are the ones meta.json lists; empty
    mappings otherwise."""
    path = committed_file(run_dir, CONFIG_FILE)
    try:
        data = read_bytes(path, what="config", max_bytes=MAX_SMALL_FILE)
        if sha256_bytes(data) != meta["files"].get(CONFIG_FILE):
            return {}, {}
        raw = loads_yaml(data, source=path, what="config")
    except (UserError, OSError):
        return {}, {}
    groups = [raw.get(name) if isinstance(raw, dict) else None for name in ("model", "train")]
    model, train = (group if isinstance(group, dict) else {} for group in groups)
    return model, train
