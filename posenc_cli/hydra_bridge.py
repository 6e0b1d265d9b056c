"""The only module that touches Hydra: compose configs from `configs/` plus overrides.

Everything else receives the plain `Config` dataclasses built by `config.config_from_dict`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from posenc_cli.config import Config, config_from_dict, unknown_key_message
from posenc_cli.errors import ConfigError

ROOT_CONFIG = "config"


def config_dir() -> Path:
    """The packaged configs (inside the wheel) or, in a source checkout, the top-level `configs/`."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / f"{ROOT_CONFIG}.yaml").is_file():
            return candidate
    raise ConfigError(f"posenc's configs/ directory was not found next to {here}; reinstall posenc")


def register_schemes() -> None:
    """Make every registered scheme a `pos` option (`pos=alibi` works without a YAML file)."""
    from hydra.core.config_store import ConfigStore

    from posenc_cli.positional import registry

    store = ConfigStore.instance()
    for name, cls in registry().items():
        store.store(group="pos", name=name, node=cls.config_cls(name=name))


def searchpath_override(user_dir: Path | None) -> list[str]:
    if user_dir is None:
        return []
    user_dir = Path(user_dir).resolve()
    if not user_dir.is_dir():
        raise ConfigError(f"--config-dir {user_dir} is not a directory")
    return [f"hydra.searchpath=[file://{user_dir}]"]


def compose_dict(overrides: list[str], user_config_dir: Path | None = None) -> dict[str, Any]:
    """Compose the root config with Hydra overrides into a plain, resolved dict (no `hydra` key)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_schemes()
    all_overrides = [*overrides, *searchpath_override(user_config_dir)]
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = compose(config_name=ROOT_CONFIG, overrides=all_overrides)
        raw = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        match = re.match(r"Could not override '([^']+)'.\s+To append", str(e))
        if match:
            raise ConfigError(unknown_key_message(match.group(1))) from e
        raise ConfigError(one_line(e)) from e
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    return raw


def compose_config(overrides: list[str], user_config_dir: Path | None = None) -> Config:
    """Compose and validate: the `Config` a command runs with."""
    return config_from_dict(compose_dict(overrides, user_config_dir))


def one_line(exc: BaseException) -> str:
    """Hydra/OmegaConf errors span several lines with hints and search paths: keep what names the problem."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    parts = [lines[0]]
    options: list[str] = []
    in_options = False
    for ln in lines[1:]:
        if ln.startswith(("Config search path", "See https", "provider=")):
            in_options = False
            continue
        if ln.startswith("Available options"):
            in_options = True
            continue
        if in_options:
            options.append(ln)
        elif ln.startswith(("Key '", "full_key:", "missing ", "no viable")):
            parts.append(ln)
    text = " ".join(parts)
    if options:
        text += f" (available: {', '.join(options)})"
    return text
