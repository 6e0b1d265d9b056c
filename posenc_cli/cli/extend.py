"""`posenc extend`: RoPE frequency scaling of a checkpoint into a new run directory (+ optional short fine-tune)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from posenc_cli.cli.app import app, console, err_console, handles_errors, stdout_is_terminal
from posenc_cli.config import ExtendConfig
from posenc_cli.errors import ConfigError
from posenc_cli.rope_scaling import get_method, param_fields, registry

if TYPE_CHECKING:
    from posenc_cli.run.outcome import ExtendResult

_D = ExtendConfig()  # flag defaults = configs/extend/default.yaml = ExtendConfig's defaults
_REMAP = "Self-Extend / ReRoPE"
# One example per line (Typer keeps single line breaks in an epilog), each short enough for 80 columns.
_EPILOG = "\n".join(
    [
        "Examples:",
        "  posenc extend outputs/runs/rope --yarn --factor 4 --eval",
        "  posenc extend RUN --yarn --factor 4 --finetune-steps 60 --out RUN-yarn-ft",
        "  posenc extend RUN --llama3 --factor 8 --low-freq-factor 1 --high-freq-factor 4",
        "  posenc extend RUN --longrope --search --factor 4",
        "  posenc extend RUN --method self-extend --window 64 --group 4",
        "  posenc extend RUN --method rerope --window 96",
    ]
)


# ----------------------------------------------------------------------------------------------------------------
# The registry's part of the command line: one `--<method>` shorthand per scaling method and one flag per method
# parameter (`--beta-fast`, `--truncate/--no-truncate`, ...), in the method's help panel. Added to the command's
# signature, so Typer builds them like the written-out options; a new method file brings its own.


def _scaling_options() -> tuple[dict[str, str], list[inspect.Parameter]]:
    """({parameter name: method} of the shorthands, the generated parameters)."""
    aliases, params = {}, []
    for name in registry():
        arg = f"use_{name}"
        aliases[arg] = name
        option = typer.Option(f"--{name}", help=f"Shorthand for --method {name}.", rich_help_panel="Method")
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=False,
                                        annotation=Annotated[bool, option]))  # fmt: skip
    for f in param_fields().values():
        flag = "--" + f.name.replace("_", "-")
        decl = f"{flag}/--no-{flag[2:]}" if f.type is bool else flag
        panel = registry()[f.method].title
        option = typer.Option(decl, help=f.help, metavar=f.metavar, rich_help_panel=panel)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=getattr(_D, f.name),
                                        annotation=Annotated[f.type, option]))  # fmt: skip
    return aliases, params


def _with_scaling_options(func: Callable[..., None]) -> Callable[..., None]:
    """`func(..., chosen=[methods named by shorthands], scaling={parameter: value})` as a command that also takes
    the generated options (inserted before `--factor`)."""
    aliases, generated = _scaling_options()
    names = {p.name for p in generated}

    def command(**kwargs: Any) -> None:
        chosen = [method for arg, method in aliases.items() if kwargs.pop(arg)]
        scaling = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
        func(**kwargs, chosen=chosen, scaling=scaling)

    own = [p for p in inspect.signature(func, eval_str=True).parameters.values() if p.name not in ("chosen", "scaling")]
    at = next(i for i, p in enumerate(own) if p.name == "method")
    params = [*own[:at], *generated[: len(aliases)], *own[at : at + 3], *generated[len(aliases) :], *own[at + 3 :]]
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    )
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__, command.__qualname__ = func.__name__, func.__qualname__
    titles = ", ".join(m.title for m in registry().values())
    command.__doc__ = (func.__doc__ or "").replace("{methods}", titles)  # one line per paragraph: handles_errors
    return command


@app.command("extend", epilog=_EPILOG)
@handles_errors
@_with_scaling_options
def extend_command(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="The RoPE run directory to extend (never modified).")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", metavar="DIR", help="New run directory (default: <RUN_DIR>-<method>x<factor> next to it)."
        ),
    ] = None,
    method: Annotated[
        str | None,
        typer.Option(
            "--method",
            metavar="METHOD",
            help=f"One of {', '.join(registry())}, self-extend, rerope (default {_D.method}).",
            rich_help_panel="Method",
        ),
    ] = None,
    factor: Annotated[float, typer.Option("--factor", help="Scale factor s (> 1).")] = _D.factor,
    original_length: Annotated[
        int | None,
        typer.Option(
            "--original-length", metavar="L", help="Original length L (default: the checkpoint's training length)."
        ),
    ] = _D.original_length,
    finetune_steps: Annotated[
        int,
        typer.Option(
            "--finetune-steps", metavar="N", help="Fine-tune the scaled model N steps.", rich_help_panel="Fine-tune"
        ),
    ] = _D.finetune_steps,
    finetune_seq_len: Annotated[
        int | None,
        typer.Option(
            "--finetune-seq-len", metavar="L'", help="Fine-tune length (default s·L).", rich_help_panel="Fine-tune"
        ),
    ] = _D.finetune_seq_len,
    finetune_lr: Annotated[
        float, typer.Option("--finetune-lr", metavar="LR", help="Fine-tune peak lr.", rich_help_panel="Fine-tune")
    ] = _D.finetune_lr,
    finetune_warmup: Annotated[
        int,
        typer.Option("--finetune-warmup", metavar="N", help="Fine-tune warm-up steps.", rich_help_panel="Fine-tune"),
    ] = _D.finetune_warmup,
    pose: Annotated[
        bool,
        typer.Option(
            "--pose",
            help="PoSE: fine-tune at the original length L with position ids skip-wise spanning the fine-tune "
            "length (Zhu et al. 2023).",
            rich_help_panel="Fine-tune",
        ),
    ] = _D.pose,
    pose_chunks: Annotated[
        int,
        typer.Option("--pose-chunks", metavar="N", help="PoSE chunks per window.", rich_help_panel="Fine-tune"),
    ] = _D.pose_chunks,
    logn: Annotated[
        bool | None,
        typer.Option(
            "--logn/--no-logn",
            help="Scale query i's logits by max(1, log(i + 1) / log L) beyond the original length L (Qwen's log-n). "
            "Default: on for rerope (as bojone/rerope), off otherwise (self-extend: as LongLM's default).",
            show_default=False,
        ),
    ] = None,
    evaluate: Annotated[
        bool, typer.Option("--eval", help="Run eval-extrapolate (default lengths) on parent and child, side by side.")
    ] = False,
    threads: Annotated[int, typer.Option("--threads", metavar="N", help="CPU threads (0: torch's default).")] = 0,
    factors: Annotated[
        Path | None,
        typer.Option(
            "--factors",
            metavar="FILE",
            help='LongRoPE factors: JSON {"short_factor": [...], "long_factor": [...]}, d/2 values each.',
            rich_help_panel="LongRoPE",
        ),
    ] = None,
    search: Annotated[
        bool,
        typer.Option(
            "--search",
            help="Find LongRoPE's long factors by evolutionary search, scored by perplexity at s·L on the start of "
            "the training split (evaluations read only the validation split).",
            rich_help_panel="LongRoPE",
        ),
    ] = False,
    search_budget: Annotated[
        int,
        typer.Option("--search-budget", metavar="N", help="Candidates the search scores.", rich_help_panel="LongRoPE"),
    ] = 16,
    search_seed: Annotated[
        int, typer.Option("--search-seed", metavar="N", help="Seed of the search.", rich_help_panel="LongRoPE")
    ] = 0,
    search_tokens: Annotated[
        int,
        typer.Option(
            "--search-tokens", metavar="N", help="Training-split tokens per candidate.", rich_help_panel="LongRoPE"
        ),
    ] = 8192,
    window: Annotated[
        int | None,
        typer.Option(
            "--window", metavar="W", help="Neighbour window W (distances < W keep RoPE).", rich_help_panel=_REMAP
        ),
    ] = None,
    group: Annotated[
        int | None,
        typer.Option("--group", metavar="G", help="Self-Extend's group size G.", rich_help_panel=_REMAP),
    ] = None,
    leaky: Annotated[
        float | None,
        typer.Option(
            "--leaky",
            metavar="K",
            help="Leaky ReRoPE: W + (i - j - W)/K beyond the window (K > 1).",
            rich_help_panel=_REMAP,
        ),
    ] = None,
    *,
    chosen: list[str],
    scaling: dict[str, Any],
) -> None:
    """Scale a RoPE checkpoint's frequencies ({methods}) into a new run directory.

    The new run's config records the scaling, its weights are the parent's (unchanged, unless fine-tuned), and its
    metadata names the parent; `posenc eval-extrapolate` works on it as on any run. Re-running the same command is
    a no-op, or resumes an interrupted fine-tune. `dynamic` rescales per sequence length at run time (also while
    fine-tuning). `--method self-extend --window W --group G` and `--method rerope --window W [--leaky K]` remap
    positions beyond the window at inference instead (recorded as pos.remap; no scaling, no fine-tune); rerope
    also scales queries by log-n, as its reference does (--no-logn: not).
    """
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.extension.extend import default_out_dir, extend_run, finetune_length
    from posenc_cli.positional.remap import REMAP_METHODS

    remap_given = {"--window": window, "--group": group, "--leaky": leaky}
    if method in REMAP_METHODS:
        if chosen:
            raise ConfigError(f"give one method, got {', '.join([*chosen, method])}")
        given = {
            "--factor": factor != _D.factor,
            "--original-length": original_length is not None,
            "--finetune-steps": finetune_steps != _D.finetune_steps,
            "--pose": pose,
            "--factors": factors is not None,
            "--search": search,
            **{"--" + k.replace("_", "-"): v != getattr(_D, k) for k, v in scaling.items()},
        }
        if wrong := [flag for flag, on in given.items() if on]:
            raise ConfigError(f"{wrong[0]} does not apply to --method {method} (a remapping at inference, no scaling)")
        _remap(run_dir, out, method, window, group, leaky, logn, evaluate, threads)
        return
    if given_remap := [flag for flag, value in remap_given.items() if value is not None]:
        raise ConfigError(f"{given_remap[0]} belongs to --method self-extend or rerope")
    if method is not None:
        chosen.append(method)
    if len(set(chosen)) > 1:
        raise ConfigError(f"give one scaling method, got {', '.join(chosen)}")
    if (factors is not None or search) and not chosen:
        chosen.append("longrope")  # --factors and --search are LongRoPE's
    ext = ExtendConfig(
        method=chosen[0] if chosen else _D.method,
        factor=factor,
        original_length=original_length,
        **scaling,
        finetune_steps=finetune_steps,
        finetune_seq_len=finetune_seq_len,
        finetune_lr=finetune_lr,
        finetune_warmup=finetune_warmup,
        pose=pose,
        pose_chunks=pose_chunks,
        logn=bool(logn),
    )
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.extension.extend import validate_extend

    ext = _longrope_factors(ext, factors, search)
    validate_extend(ext)  # before naming the default directory after the method
    out_dir = out if out is not None else default_out_dir(run_dir, ext)
    found = identity = None
    if search:  # refuses a run that is not RoPE, and decides "already done", before any search or write
        ext, found, identity = _search(run_dir, out_dir, ext, search_budget, search_seed, search_tokens, threads)

    if ext.finetune_steps > 0:
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.run.progress import TrainDisplay

        with TrainDisplay(console, live=stdout_is_terminal(), log_every=1) as display:
            result = extend_run(run_dir, out_dir, ext, threads=threads, callback=display, search=identity)
    else:
        result = extend_run(run_dir, out_dir, ext, threads=threads, search=identity)
    console.print(summary_table(result))
    if search and result.status != "interrupted":
        _report_search(result, ext, found)
    if ext.pose:
        span = finetune_length(ext, result.original_length)
        console.print(f"PoSE: fine-tuned on {result.train_length}-token windows, position ids spanning {span}")
    if result.status == "interrupted":
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.run.progress import interrupted_message

        assert result.finetune is not None
        err_console.print(f"[yellow]{escape(interrupted_message(result.finetune))}[/]", highlight=False)
        raise typer.Exit(128 + (result.finetune.signal or 2))
    if evaluate:
        _evaluate_both(result, threads)


# ----------------------------------------------------------------------------------------------------------------
# Self-Extend and ReRoPE: position remapping at inference (`pos.remap`), no new frequencies, no training.


def _remap(
    run_dir: Path,
    out: Path | None,
    method: str,
    window: int | None,
    group: int | None,
    leaky: float | None,
    logn: bool | None,
    evaluate: bool,
    threads: int,
) -> None:
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.extension.extend import remap_out_dir, remap_run
    from posenc_cli.positional.remap import RemapConfig

    if window is None:
        raise ConfigError(f"--method {method} needs --window W")
    if method == "self-extend" and group is None:
        raise ConfigError("--method self-extend needs --group G")
    if method == "self-extend" and leaky is not None:
        raise ConfigError("--leaky belongs to --method rerope")
    if method == "rerope" and group is not None:
        raise ConfigError("--group belongs to --method self-extend")
    remap = RemapConfig(method=method, window=window, group=group or 0, leaky=leaky or 0.0)
    remap.validate()  # before naming the default directory after the settings
    out_dir = out if out is not None else remap_out_dir(run_dir, remap, logn)
    result = remap_run(run_dir, out_dir, remap, threads=threads, logn=logn)
    title = "already remapped (nothing to do)" if result.status == "already_complete" else "positions remapped"
    t = Table(title=f"posenc extend · {title}", title_justify="left", header_style="bold")
    t.add_column("", style="bold")
    t.add_column("before (parent)")
    t.add_column("after (child)")
    t.add_row("run", Text(_shown(result.parent_dir), overflow="fold"), Text(_shown(result.out_dir), overflow="fold"))
    rope = "RoPE" if result.parent_scaling == "none" else f"RoPE, {result.parent_scaling}"
    t.add_row("positions", rope, f"{rope}, {result.remap.describe()}")
    for n, d in result.largest_distance.items():
        t.add_row(f"largest relative position at {n} tokens", str(n - 1), f"{d:g}")
    if result.logn_length is not None:
        t.add_row("query scaling", "none", f"log-n: max(1, log(i + 1) / log {result.logn_length})")
    t.add_row("training length", str(result.train_length), str(result.train_length))
    t.add_row("weights", "", "copied unchanged")
    console.print(t)
    if evaluate:
        _evaluate_both(result, threads)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------------------
# LongRoPE's factors: from --factors FILE, the --short-factor/--long-factor flags, or --search.


def _longrope_factors(ext: ExtendConfig, factors: Path | None, search: bool) -> ExtendConfig:
    """`ext` with the factors of --factors FILE; one-line errors for LongRoPE options given to another method,
    for two sources of factors, and for LongRoPE without factors."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.config import replace
    from posenc_cli.rope_scaling.longrope import FACTOR_KEYS

    flags = [k for k in FACTOR_KEYS if getattr(ext, k) is not None]
    given = [*(["--factors"] if factors is not None else []), *(["--search"] if search else [])]
    given += ["--" + k.replace("_", "-") for k in flags]
    if ext.method != "longrope":
        if given:
            raise ConfigError(f"{given[0]} belongs to LongRoPE (--longrope), not --method {ext.method}")
        return ext
    if factors is not None and search:
        raise ConfigError("give --factors FILE or --search, not both")
    if (factors is not None or search) and flags:
        raise ConfigError(f"give the factors once: {given[0]} or --{flags[0].replace('_', '-')}")
    if not given:
        raise ConfigError("LongRoPE needs its factors: --factors FILE, --search, or --long-factor (d/2 times)")
    if factors is None:
        return ext
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.rope_scaling.longrope import read_factors_file

    return replace(ext, **read_factors_file(factors))


def _search(
    run_dir: Path, out_dir: Path, ext: ExtendConfig, budget: int, seed: int, tokens: int, threads: int
) -> tuple[ExtendConfig, Any, dict[str, Any]]:
    """LongRoPE's search with a progress bar (stderr, on a terminal): (ext with the found factors, the search or None
    when `out_dir` already holds its child, its identity for the child's record)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.cli.app import progress_bar
    from posenc_cli.extension.longrope_search import searched_factors

    with progress_bar() as bar:
        task = bar.add_task(f"LongRoPE search ×{ext.factor:g}", total=budget)

        def progress(done: int, total: int, best: float) -> None:
            bar.update(task, completed=done, total=total,
                       description=f"LongRoPE search ×{ext.factor:g} · best ppl {best:.4g}")  # fmt: skip

        return searched_factors(run_dir, out_dir, ext, budget=budget, seed=seed, tokens=tokens, threads=threads,
                                progress=progress)  # fmt: skip


def _report_search(result: ExtendResult, ext: ExtendConfig, found: Any) -> None:
    """Write the factors file into the child and say what the search found, what it cost and which tokens it
    scored (or that the child of this same search was already there)."""
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.extension.longrope_search import write_factors

    if found is None:
        console.print(
            f"LongRoPE search: not re-run; {escape(_shown(result.out_dir))} already holds the child of this search "
            "(its factors are in its config)",
            highlight=False,
        )
        return
    assert ext.short_factor is not None
    path = write_factors(result.out_dir, ext.short_factor, found)
    n = len(found.history)
    seed_name = min(found.initial, key=found.initial.get)
    data = found.data
    console.print(
        f"LongRoPE search: {n} candidates in {found.seconds:.1f} s ({n / max(found.seconds, 1e-9):.2f}/s, "
        f"{found.tokens} tokens each at {found.target_length}, {data['split']} split tokens "
        f"[{data['start']}, {data['end']}), apart from every evaluation); best perplexity {found.ppl:.4g} "
        f"(best seed {seed_name} {found.initial[seed_name]:.4g}); factors in {escape(_shown(path))}",
        highlight=False,
    )


# ----------------------------------------------------------------------------------------------------------------
# Rendering.


def summary_table(r: ExtendResult) -> Table:
    """Before/after: scaling, attention factor, frequency pairs, longest wavelength, lengths, directories."""
    pairs = r.rotary_dim // 2
    at = " (at s·L tokens; it rescales per sequence length)" if get_method(r.method).length_dependent else ""
    title = {
        "created": "extended",
        "finetuned": "extended and fine-tuned",
        "already_complete": "already extended (nothing to do)",
        "interrupted": "extended; fine-tune interrupted",
    }[r.status]
    t = Table(title=f"posenc extend · {title}", title_justify="left", header_style="bold")
    t.add_column("", style="bold")  # wraps too, so a narrow terminal does not squeeze only the values
    plain = r.parent_scaling == "none"
    t.add_column("before (parent)" if plain else "before (plain RoPE; parent scaling replaced)")
    t.add_column("after (child)")
    # Paths fold onto more lines in a narrow terminal instead of being cut to "outputs/sweeps/2…".
    t.add_row("run", Text(_shown(r.parent_dir), overflow="fold"), Text(_shown(r.out_dir), overflow="fold"))
    t.add_row("scaling", r.parent_scaling, f"{r.method} ×{r.factor:g} (original length L = {r.original_length})")
    logits = f"; logits ×{r.attention_factor**2:.4f}" if r.attention_factor != 1.0 else ""
    t.add_row("attention factor", "1", f"{r.attention_factor:.4f} on cos and sin{logits}")
    t.add_row(
        f"frequency pairs (d = {r.rotary_dim}, base {r.base:g})",
        f"{pairs} keep",
        f"{r.regions['keep']} keep · {r.regions['blend']} blended · {r.regions['interpolate']} interpolated{at}",
    )
    before, after = r.longest_wavelength
    t.add_row("longest wavelength", f"{_tokens(before)} tokens", f"{_tokens(after)} tokens{at}")
    t.add_row("training length", str(r.parent_train_length), str(r.train_length))
    t.add_row("base length (1×)", str(r.base_length), str(r.base_length))
    if r.finetune is not None:
        f = r.finetune
        val = f"val loss {f.val_loss:.4f}" if f.val_loss is not None and math.isfinite(f.val_loss) else "no val loss"
        t.add_row("fine-tune", "", f"step {f.step}/{f.steps} at {r.train_length} tokens · {val}")
    else:
        t.add_row("weights", "", "copied unchanged")
    return t


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (default outputs are resolved paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _tokens(x: float) -> str:
    return f"{x:,.0f}"


def _evaluate_both(result: ExtendResult, threads: int) -> None:
    # deferred: keeps this command's modules off posenc --help start-up
    from posenc_cli.analysis.compare import labelled_in_order
    from posenc_cli.config import EvalConfig
    from posenc_cli.evaluation.perplexity import CorpusCache, evaluate_run_dir
    from posenc_cli.report.tables import extrapolation_table

    cfg = EvalConfig()
    corpora = CorpusCache()
    docs = []
    for path, store in ((result.parent_dir, False), (result.out_dir, True)):  # the source run is never written
        with console.status(f"evaluating {escape(str(path))} ...", spinner="dots"):
            docs.append(evaluate_run_dir(path, cfg, threads=threads, corpora=corpora, store=store))
    docs = labelled_in_order(docs)  # the labels compare gives these runs (a sweep's job: its plan label)
    console.print(extrapolation_table(docs, label=lambda r: r["label"]))
