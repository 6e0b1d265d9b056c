"""`posenc extend HF_DIR`: RoPE scaling of a `transformers` model directory, written as a new `transformers` directory.

The new directory's `config.json` carries the scaling in the installed `transformers`' own format (`rope_parameters`
in 5.x, written by the config class's `save_pretrained`), so it loads in plain `transformers` (and in stacks that
read the same config). Its weight files are hard links to the source's (copies across file systems); nothing in the
source is ever modified. posenc's methods map onto `transformers`' rope types as `posenc export` maps them, by each
method's `transformers` hook (posenc_cli/rope_scaling/<method>.py): linear, dynamic, yarn and llama3 by name (dynamic
with max_position_embeddings = L, the others s·L), static NTK as rope_type default with rope_theta · s^(d/(d−2)).

Which layers are scaled (`layers`, the rule of `posenc extend --layers`, as `extension.rope_layers` applies it to
posenc's own layouts): "global" (the default) scales the rope parameters of the global (full-attention) layers only,
as Google scales Gemma 3 for long context (Gemma 3 technical report, arXiv 2503.19786: the global layers' RoPE base
raised to 1M and their positions rescaled by 8, the local layers kept at base 10k; the released configs carry
`rope_scaling` linear x8, which transformers applies to the "full_attention" parameters only:
`configuration_gemma3.py`, `Gemma3TextConfig.convert_rope_params_to_dict`); a windowed layer never sees a distance
beyond its window. "all" scales every layer type. With `rope_parameters` nested by layer type (Gemma 3) each type is
scaled apart. A config with one set for every layer is scaled whole when all its RoPE layers attend globally (Llama,
SmolLM3); when some of them are windowed (Mistral-7B-v0.1, Qwen2 with `max_window_layers`, Llama 4, whose RoPE
layers are all chunked) "global" is refused in one line, as the set cannot be split, and "all" scales it whole.
The rule and the scaled layer types are recorded in `posenc_hf_extend.json` ("layers", "scaled_layer_types").

Any other method (one `transformers` has no rope type for, such as Self-Extend or ReRoPE) is refused with one line.
`transformers`' `longrope` takes per-dimension factors, from `--factors FILE` (`--search` needs a posenc run).
The written config is read back and its rope parameters checked before the directory appears (atomic rename), and
`posenc_hf_extend.json` records the parent, the settings and the parent's training and base length.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc_cli import __version__
from posenc_cli.config import ExtendConfig
from posenc_cli.errors import ConfigError
from posenc_cli.extension.identity import differences
from posenc_cli.extension.limits import frequency_numbers
from posenc_cli.extension.settings import LAYER_RULES  # the rules of posenc's own layouts
from posenc_cli.rope_scaling import get_method, registry
from posenc_cli.run.hf_layers import HFLayout, hf_layout
from posenc_cli.run.hf_run import CONFIG_FILE, SIDE_FILES, inspect_hf_dir, load_hf_run
from posenc_cli.run.journal import fsync_dir
from posenc_cli.run.outcome import ExtendResult

__all__ = [
    "RECORD_FILE",
    "HFExtendResult",
    "extend_hf_dir",
    "hf_methods",
    "hf_rope_parameters",
    "scaled_layer_types",
]


def hf_methods() -> tuple[str, ...]:
    """The scaling methods `transformers` has a rope type for (the exportable ones)."""
    return tuple(name for name, m in registry().items() if m.rope_type is not None)


RECORD_FILE = "posenc_hf_extend.json"
_IDENTITY = (
    "method",
    "factor",
    "original_length",
    "layers",
    "rope_parameters",
    "max_position_embeddings",
    "parent_weights",
)


@dataclass
class HFExtendResult(ExtendResult):
    """`ExtendResult` plus which layers of a transformers directory were scaled."""

    layers: str = "global"  # the rule applied (`LAYER_RULES`)
    scaled_types: tuple[str, ...] = ()  # layer types whose rope parameters were scaled
    kept_types: tuple[str, ...] = ()  # RoPE layer types left as they were


def scaled_layer_types(layout: HFLayout, rule: str, src: Path) -> tuple[str, ...]:
    """The layer types whose rope parameters `rule` scales; empty: the one set every layer shares (scaled whole).

    ConfigError (one line) for an unknown rule and for a rule the config cannot honour (see the module docstring).
    """
    if rule not in LAYER_RULES:
        raise ConfigError(f"--layers must be one of {', '.join(LAYER_RULES)}, got {rule!r}")
    if not layout.rope_types:  # one set of rope parameters for every RoPE layer
        rotating = layout.rope_layer_types()
        local = [t for t in rotating if t not in layout.global_types]
        if rule == "global" and local and len(local) == len(rotating):
            raise ConfigError(
                f"{src}: no global layer rotates (its RoPE layers: {', '.join(local)}): nothing for --layers global "
                "to scale; --layers all scales the windowed ones"
            )
        if rule == "global" and local:
            raise ConfigError(
                f"{src}: one set of rope parameters serves global and windowed RoPE layers alike "
                f"({', '.join(rotating)}), so the global layers cannot be scaled alone; --layers all scales it whole"
            )
        return ()
    if rule == "all":
        return layout.rope_types
    targets = tuple(t for t in layout.global_types if t in layout.rope_types)
    if not targets:
        raise ConfigError(
            f"{src}: its global layers ({', '.join(layout.global_types) or 'none'}) have no rope parameters of "
            f"their own (only {', '.join(layout.rope_types)}); --layers all scales those"
        )
    return targets


def hf_rope_parameters(
    ext: ExtendConfig, current: dict[str, Any], original_length: int, rotary_dim: int
) -> tuple[dict[str, Any], int]:
    """(rope_parameters, max_position_embeddings) of the scaled config (see the module table).

    `current` is the source's standardised `rope_parameters`; its `rope_theta` and `partial_rotary_factor` are kept,
    any earlier scaling is replaced.
    """
    if ext.method not in hf_methods():
        raise ConfigError(
            f"scaling method '{ext.method}' has no transformers rope type; a transformers directory extends with "
            f"{', '.join(hf_methods())}"
        )
    keep = {k: current[k] for k in ("rope_theta", "partial_rotary_factor") if k in current}
    hf = get_method(ext.method).transformers(ext.params, float(ext.factor), int(original_length), rotary_dim)
    assert hf is not None  # hf_methods() are the methods with a rope type
    params: dict[str, Any] = {**keep, **hf.parameters}
    if hf.theta_scale != 1.0:  # static NTK: a plain RoPE with a larger base
        params["rope_theta"] = float(keep["rope_theta"]) * hf.theta_scale
    return params, hf.max_position_embeddings


def _rotary(config: Any, rope: dict[str, Any]) -> tuple[int, float]:
    """(rotary dim, base) as transformers computes them: int(head_dim · partial_rotary_factor), rope_theta."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * float(rope.get("partial_rotary_factor", 1.0))), float(rope["rope_theta"])


def _numbers(ext: ExtendConfig, rotary: int, base: float, L: int) -> tuple[float, dict[str, int], tuple[float, float]]:
    """(attention factor, frequency regions, longest wavelength before/after) for the summary (posenc's maths,
    tested equal to transformers'); ConfigError for a factor out of the method's range."""
    return frequency_numbers(ext.method, rotary, base, ext.factor, L, **ext.param_values())


def _describe(rope: dict[str, Any]) -> str:
    kind = rope.get("rope_type", "default")
    return "none" if kind == "default" else f"{kind} x{rope.get('factor', '?')}"


def _existing(out: Path, record: dict[str, Any]) -> bool:
    """True when `out` already holds this extension; False when absent or empty; ConfigError otherwise."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise ConfigError(f"output directory {out} exists and is not a directory")
    if not any(out.iterdir()):
        return False
    old = None
    with contextlib.suppress(OSError, ValueError, RecursionError):
        old = json.loads((out / RECORD_FILE).read_text())
    if isinstance(old, dict) and old.get("kind") == record["kind"]:
        # records from before `layers` scaled one rope set whole, which any rule that reaches here does as well
        old.setdefault("layers", record["layers"])
        diffs = differences(old, record, _IDENTITY)
        if not diffs:
            return True
        raise ConfigError(
            f"output directory {out} already holds a different extension (other {'; '.join(diffs)}); "
            "choose another --out"
        )
    raise ConfigError(f"output directory {out} exists and is not empty; choose another --out")


def _link_or_copy(src: Path, dst: Path) -> bool:
    """Hard-link `src` (its target, when a symlink as in the hub cache) to `dst`; copy when linking fails."""
    try:
        os.link(src.resolve(), dst)
        return True
    except OSError:
        shutil.copy2(src, dst)
        return False


def _write_files(src: Path, tmp: Path) -> bool:
    """Weights (*.safetensors) linked, other top-level files copied; config.json (written separately), posenc's
    own records, hidden files and subdirectories (e.g. eval/) are left out. True when every weight was linked."""
    linked = True
    for path in sorted(src.iterdir()):
        if not path.is_file() or path.name.startswith(".") or path.name in (CONFIG_FILE, *SIDE_FILES):
            continue
        if path.suffix == ".safetensors":
            linked = _link_or_copy(path, tmp / path.name) and linked
        else:
            shutil.copy2(path, tmp / path.name)
    return linked


def _check_written(tmp: Path, rope: dict[str, Any], max_pos: int) -> None:
    """Read the written config back with transformers; its rope parameters must be the ones we set."""
    # deferred: keeps transformers off posenc --help start-up
    from transformers import AutoConfig

    back = AutoConfig.from_pretrained(str(tmp), trust_remote_code=False).get_text_config()
    got = dict(back.rope_parameters or {})
    wrong = [k for k, v in _flat_items(rope) if _flat_get(got, k) != v]
    if wrong or back.max_position_embeddings != max_pos:
        what = wrong[0] if wrong else "max_position_embeddings"
        raise ConfigError(f"transformers did not keep the rope parameter '{what}' as written; nothing was written")


def _flat_items(rope: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """("full_attention.rope_type", "yarn"), ... for nested parameters; ("rope_type", "yarn"), ... for one set."""
    items: list[tuple[str, Any]] = []
    for k, v in rope.items():
        items += _flat_items(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return items


def _flat_get(rope: dict[str, Any], key: str) -> Any:
    value: Any = rope
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _new_temp_dir(out: Path) -> Path:
    """A new, uniquely named directory next to `out`, with the mode a plain mkdir gives (0o777 less the umask),
    which the finished directory keeps: `tempfile.mkdtemp`'s 0o700 would make the extension private."""
    for _ in range(100):
        tmp = out.parent / f".{out.name}.extend-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name next to {out}")  # pragma: no cover - 100 collisions of 32 bits


def _publish(tmp: Path, out: Path) -> None:
    for path in tmp.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    try:
        if out.is_dir():
            out.rmdir()  # empty: checked before anything was written
        os.replace(tmp, out)
    except OSError as e:  # another process filled `out` meanwhile
        raise ConfigError(f"output directory {out} was written by another process meanwhile ({e.strerror})") from e
    fsync_dir(out.parent)


def extend_hf_dir(
    src_dir: Path | str, out_dir: Path | str, ext: ExtendConfig, *, layers: str | None = None
) -> HFExtendResult:
    """Write the RoPE-scaled copy of transformers directory `src_dir` to `out_dir` (absent or empty).

    `layers` (else `ext.layers`, `posenc extend --layers`): which layers' rope parameters are scaled
    (`scaled_layer_types`). Refused with one line before anything is written: a fine-tune (not supported for
    these directories), a directory `load_hf_run` refuses, a model that is not RoPE, a `layers` rule its config cannot
    honour, a method transformers has no rope type for, and a non-empty `out_dir` (unless it holds this very
    extension: then nothing is done).
    """
    src, out = Path(src_dir), Path(out_dir)
    inspect_hf_dir(src)  # config.json's refusals come before transformers is imported (about a CPU-second)
    import transformers
    from transformers import AutoConfig

    if ext.finetune_steps > 0:
        raise ConfigError("--finetune-steps is not supported for a transformers directory; extend without it")
    run = load_hf_run(src)  # every refusal of a directory (tokenizer, remote code, corrupt weights) comes first
    if run.config.pos.name != "rope":
        raise ConfigError(f"{src} uses {run.config.pos.name} positions; extend applies only to RoPE models")
    config = AutoConfig.from_pretrained(str(src), trust_remote_code=False)
    text = config.get_text_config()  # a multimodal config keeps the language model's rope parameters here
    layout = hf_layout(text)
    rule = layers or ext.layers
    targets = scaled_layer_types(layout, rule, src)
    current = dict(text.rope_parameters or {})
    sets = {t: current.get(t) for t in targets} if targets else {"": current}
    for name, params in sets.items():
        if not isinstance(params, dict) or "rope_theta" not in params:
            raise ConfigError(f"{src}: the {name or 'model'}'s rope parameters name no rope_theta; cannot scale them")
    parent_length, base_length = run.meta.lengths(run.config)
    L = int(ext.original_length or parent_length)
    scaled: dict[str, dict[str, Any]] = {}
    numbers: dict[str, tuple[Any, ...]] = {}
    for name, params in sets.items():
        rotary, base = _rotary(text, params)
        numbers[name] = (rotary, base, *_numbers(ext, rotary, base, L))  # first: refuses a factor out of range
        scaled[name], max_pos = hf_rope_parameters(ext, params, L, rotary)
    first = next(iter(sets))  # the summary's numbers: the first scaled layer type's (Gemma 3: full_attention)
    rotary, base, attention, regions, wavelengths = numbers[first]
    rope = {**current, **scaled} if targets else scaled[""]
    scaled_types = targets or layout.rope_layer_types()
    weights = {p.name: p.stat().st_size for p in sorted(src.iterdir()) if p.suffix == ".safetensors"}
    record = {
        "kind": "posenc-hf-extend",
        "parent": str(src.resolve()),
        "method": ext.method,
        "factor": float(ext.factor),
        "original_length": L,
        "layers": rule,
        "scaled_layer_types": list(scaled_types),
        "rope_parameters": rope,
        "max_position_embeddings": max_pos,
        "parent_weights": weights,
        "train_length": parent_length,
        "base_length": base_length,
        "posenc_version": __version__,
        "transformers_version": transformers.__version__,
    }
    result = HFExtendResult(
        parent_dir=src,
        out_dir=out,
        status="created",
        method=ext.method,
        factor=float(ext.factor),
        original_length=L,
        attention_factor=attention,
        rotary_dim=rotary,
        base=base,
        regions=regions,
        longest_wavelength=wavelengths,
        parent_scaling=_describe(sets[first]),
        parent_train_length=parent_length,
        base_length=base_length,
        train_length=parent_length,
        layers=rule,
        scaled_types=tuple(scaled_types),
        kept_types=tuple(t for t in layout.rope_types if t not in targets),
    )
    del run
    if _existing(out, record):
        result.status = "already_complete"
        return result

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp_dir(out)
    try:
        text.rope_parameters = rope
        text.max_position_embeddings = max_pos
        if isinstance(getattr(text, "original_max_position_embeddings", None), int):  # Phi-3 keeps it at top level
            text.original_max_position_embeddings = L
        config.save_pretrained(str(tmp))
        record["weights_linked"] = _write_files(src, tmp)
        _check_written(tmp, rope, max_pos)
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
