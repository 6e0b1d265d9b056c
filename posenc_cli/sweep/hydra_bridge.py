"""Hydra's multirun for sweeps: overrides parsed with Hydra's grammar, job directory names, and a stage launched
through Hydra's launcher (any installed plugin); single-run composition is `run.config_compose`'s.

Everything else receives the plain `Config` dataclasses built by `run.config_load.config_from_dict`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc_cli.config import ROOT_CONFIG, config_dir, suggest
from posenc_cli.errors import ConfigError
from posenc_cli.run.config_compose import one_line, register_groups, searchpath_override

# ----------------------------------------------------------------------------------------------------------------
# Multirun (sweeps): expansion in posenc's own code for --dry-run, and Hydra's launcher for the real thing.


def parse_overrides(overrides: list[str]) -> list[tuple[str, str, list[str] | None]]:
    """[(key, input line, swept values or None)] for each override, using Hydra's own override grammar."""
    # deferred: keeps Hydra off posenc --help start-up
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(one_line(e)) from e
    out = []
    for o in parsed:
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else None
        out.append((o.key_or_group, o.input_line or "", values))
    return out


def job_name(lines: list[str]) -> str:
    """A job's directory name: Hydra's `override_dirname` for its swept overrides (sorted `key=value` lines joined by
    commas), shortened where it would not fit a file name (`short_name`)."""
    return short_name(",".join(sorted(lines)))


MAX_NAME_BYTES = 255  # NAME_MAX: the longest file name (in bytes) of Linux's and macOS's file systems
_DIGEST_CHARS = 16


def short_name(name: str) -> str:
    """`name` itself where it fits a file name (`MAX_NAME_BYTES`), else its longest prefix that leaves room for '~'
    and 16 hex digits of its sha256 (a swept long `pos.layers` list): readable, deterministic, and two long names
    that share a prefix stay apart. Hydra names a stage's job directories with it too (`launch_multirun`)."""
    data = name.encode()
    if len(data) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(data).hexdigest()[:_DIGEST_CHARS]
    prefix = data[: MAX_NAME_BYTES - 1 - _DIGEST_CHARS].decode(errors="ignore")  # never half a character
    return f"{prefix}~{digest}"


_NAME_RESOLVER = "posenc_job_dir"  # `short_name` as an OmegaConf resolver, for Hydra's `hydra.sweep.subdir`
_SUBDIR = "'${" + _NAME_RESOLVER + ":${hydra.job.override_dirname}}'"  # quoted, or Hydra's grammar refuses it


def launch_multirun(
    task_overrides: list[str],
    *,
    job: Callable[[dict[str, Any], JobInfo], Any],
    stage_dir: Path,
    exclude_keys: list[str],
    launcher_overrides: list[str],
    user_config_dir: Path | None = None,
    subdir: str | None = None,
) -> None:
    """Run one sweep stage through Hydra's multirun, so any installed launcher plugin works unchanged.

    Each job's directory is `stage_dir/<override_dirname>` (swept keys only, `short_name`; `subdir` when nothing is
    swept), and the job runs `job(raw_config, JobInfo)` (see `HydraTask`).
    """
    # deferred: keeps Hydra off posenc --help start-up
    from hydra._internal.utils import _run_hydra, get_args_parser
    from omegaconf import OmegaConf

    register_groups()
    # Hydra's launchers carry registered resolvers to their workers (Singleton state), so every job resolves it
    OmegaConf.register_new_resolver(_NAME_RESOLVER, short_name, replace=True)
    hydra_overrides = [
        f"hydra.sweep.dir={quote_value(str(stage_dir))}",
        f"hydra.sweep.subdir={subdir or _SUBDIR}",
        f"hydra.job.config.override_dirname.exclude_keys=[{','.join(exclude_keys)}]",
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
        "hydra.job.chdir=False",
        *searchpath_override(user_config_dir),
        *launcher_overrides,
    ]
    parser = get_args_parser()
    args = parser.parse_args(["--multirun", *task_overrides, *hydra_overrides])
    try:
        _run_hydra(
            args=args,
            args_parser=parser,
            task_function=HydraTask(job),
            config_path=str(config_dir()),
            config_name=ROOT_CONFIG,
        )
    except SystemExit as e:  # Hydra reports its own errors and exits; keep control in posenc
        if e.code not in (0, None):
            raise ConfigError(f"Hydra could not run stage {stage_dir.name} (see the message above)") from e


_LAUNCHER_PLUGINS = {
    "joblib": "hydra_plugins.hydra_joblib_launcher",
    "submitit_local": "hydra_plugins.hydra_submitit_launcher",
    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher",
}


def check_launcher(launcher_overrides: list[str]) -> None:
    """A clear message when a launcher plugin is asked for but not installed."""
    for line in launcher_overrides:
        key, _, value = line.lstrip("+").partition("=")
        plugin = _LAUNCHER_PLUGINS.get(value) if key == "hydra/launcher" else None
        if plugin is not None and importlib.util.find_spec(plugin) is None:
            raise ConfigError(f"hydra/launcher={value} needs Hydra's launcher plugins: pip install 'posenc[launchers]'")


def launcher_settings(launcher_overrides: list[str], user_config_dir: Path | None = None) -> tuple[str, dict[str, Any]]:
    """(launcher name, the settings the overrides give it), validated as the real launch would: the plugin is
    installed, the launcher exists (`hydra/launcher=submitit_slrum` fails, suggesting submitit_slurm), every
    `hydra.launcher.KEY` is one of its keys (`partiton` fails, suggesting partition) and its counts are in range
    (`check_launcher_values`)."""
    check_launcher(launcher_overrides)
    name = "basic"
    for line in launcher_overrides:
        key, _, value = line.lstrip("+").partition("=")
        if key == "hydra/launcher":
            name = value
    node = _launcher_node(launcher_overrides, user_config_dir)
    check_launcher_values(node)
    given = {}
    for line in launcher_overrides:
        key, _, _ = line.lstrip("+~").partition("=")
        if key.startswith("hydra.launcher."):
            given[key.removeprefix("hydra.launcher.")] = node.get(key.removeprefix("hydra.launcher."))
    return name, given


# Counts the launcher plugins take, with their least meaningful value (None leaves the choice to the plugin or Slurm).
# joblib's n_jobs is a count of processes or, negative, cores + 1 + n_jobs (-1: every core); 0 has no meaning
# (joblib/parallel.py raises "n_jobs == 0 in Parallel has no meaning" when the jobs start).
_AT_LEAST = {
    "timeout_min": 1,
    "nodes": 1,
    "tasks_per_node": 1,
    "cpus_per_task": 1,
    "cpus_per_gpu": 1,
    "gpus_per_task": 1,
    "array_parallelism": 1,
    "gpus_per_node": 0,
    "mem_gb": 0,
    "mem_per_gpu": 0,
    "mem_per_cpu": 0,
    "signal_delay_s": 0,
    "max_num_timeout": 0,
}


def check_launcher_values(node: dict[str, Any]) -> None:
    """One line for a launcher setting the plugin would refuse only once the jobs start (`n_jobs=0`, `nodes=0`)."""
    n_jobs = node.get("n_jobs")
    if isinstance(n_jobs, int) and not isinstance(n_jobs, bool) and n_jobs == 0:
        raise ConfigError(
            "hydra.launcher.n_jobs=0 has no meaning: give the number of parallel jobs (1, 2, ...), or -1 for one per "
            "core"
        )
    timeout = node.get("timeout") if "n_jobs" in node else None  # joblib's per-job timeout, in seconds
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout <= 0:
        raise ConfigError(f"hydra.launcher.timeout={timeout} must be a positive number of seconds (or null)")
    for key, least in _AT_LEAST.items():
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < least:
            raise ConfigError(f"hydra.launcher.{key}={value} must be at least {least}")


def _launcher_node(launcher_overrides: list[str], user_config_dir: Path | None) -> dict[str, Any]:
    """The composed `hydra.launcher` node; one line naming the bad launcher or key otherwise."""
    # deferred: keeps Hydra and OmegaConf (Hydra's) off posenc --help start-up
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        node = _compose_hydra(launcher_overrides, user_config_dir)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        text = one_line(e)
        bad_key = re.match(r"Could not override '(hydra\.launcher\.[^']+)'", str(e))
        if bad_key:
            rest = [o for o in launcher_overrides if not o.lstrip("+~").startswith("hydra.launcher.")]
            keys = sorted(_compose_hydra(rest, user_config_dir))
            wrong = bad_key.group(1).removeprefix("hydra.launcher.")
            text = f"unknown launcher key '{bad_key.group(1)}'{suggest(wrong, keys)}"
            text += f" (keys: {', '.join(k for k in keys if not k.startswith('_'))})"
        missing = re.search(r"Could not find 'hydra/launcher/([^']+)'.*\(available: ([^)]*)\)", text)
        if missing:
            options = [o.strip() for o in missing.group(2).split(",")]
            text = f"unknown launcher hydra/launcher={missing.group(1)}{suggest(missing.group(1), options)}"
            text += f" (available: {', '.join(options)})"
        raise ConfigError(text) from e
    return node


def _compose_hydra(overrides: list[str], user_config_dir: Path | None) -> dict[str, Any]:
    # deferred: keeps Hydra and OmegaConf (Hydra's) off posenc --help start-up
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_groups()
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        cfg = compose(
            config_name=ROOT_CONFIG,
            overrides=[*overrides, *searchpath_override(user_config_dir)],
            return_hydra_config=True,
        )
    node = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert isinstance(node, dict)
    return node


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """Facts about the running job that only the launcher knows (given to the sweep's job function)."""

    output_dir: Path
    name: str
    parallel_jobs: int = 1
    overrides: tuple[str, ...] = ()  # the job's own (swept) overrides, as its override_dirname names them


@dataclasses.dataclass(frozen=True)
class HydraTask:
    """The task function that launchers pickle: the composed config as a plain dict, plus the job's facts, to
    `job` (a module-level function, so that the task pickles by reference)."""

    job: Callable[[dict[str, Any], JobInfo], Any]

    def __call__(self, cfg: Any) -> Any:
        # deferred: keeps Hydra and OmegaConf (Hydra's) off posenc --help start-up
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        hc = HydraConfig.get()
        raw = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(raw, dict)
        n_jobs = OmegaConf.select(hc, "launcher.n_jobs", default=None)
        excluded = set(OmegaConf.select(hc, "job.config.override_dirname.exclude_keys", default=None) or [])
        own = [str(o) for o in hc.overrides.task if str(o).split("=", 1)[0].lstrip("+~") not in excluded]
        info = JobInfo(
            output_dir=Path(hc.runtime.output_dir),
            name=short_name(str(hc.job.override_dirname)),
            parallel_jobs=int(n_jobs) if n_jobs is not None else 1,
            overrides=tuple(own),
        )
        return self.job(raw, info)


def quote_value(value: str) -> str:
    """Quote a value for Hydra's override grammar when it holds characters the grammar treats specially."""
    if re.fullmatch(r"[\w./\-]+", value):
        return value
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"
