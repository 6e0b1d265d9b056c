"""`posenc extend`: RoPE frequency scaling of a checkpoint into a new run directory (+ optional short fine-tune), a
Self-Extend / ReRoPE remapping, or LongRoPE's search then scaling.

The command maps its flags to one `api.extend` call (which plans the request: every rule of which flags go together
lives in `extension.plan`), under the progress displays, and prints the result (`cli.extend_report`). The scaling
methods' shorthands and parameter flags come from the registry through the API (`cli.extend_flags`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from posenc_cli import api
from posenc_cli.api.extension import scaling_methods, scaling_params
from posenc_cli.cli.app import app, console, err_console, handles_errors, progress_bar, stdout_is_terminal
from posenc_cli.cli.extend_flags import with_scaling_options
from posenc_cli.cli.extend_report import evaluation_table, remap_table, search_line, summary_table
from posenc_cli.config import ExtendConfig

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


@app.command("extend", epilog=_EPILOG)
@handles_errors
@with_scaling_options
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
            help=f"One of {', '.join(scaling_methods())}, self-extend, rerope (default {_D.method}).",
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
    threads: Annotated[int, typer.Option("--threads", metavar="N", help="CPU threads (0: the free cores).")] = 0,
    layers: Annotated[
        str,
        typer.Option(
            "--layers",
            metavar="global|all",
            help="A per-layer layout or a transformers directory with windowed layers: change the global "
            "(full-attention) RoPE layers only (Gemma 3's rule) or all of them.",
        ),
    ] = _D.layers,
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
    defaults = scaling_params()  # a parameter flag left at its method's default is not given
    request = dict(
        method=api.one_method([*chosen, *([method] if method is not None else [])]),
        factor=factor,
        original_length=original_length,
        params={name: value for name, value in scaling.items() if value != defaults[name].default},
        finetune_steps=finetune_steps,
        finetune_seq_len=finetune_seq_len,
        finetune_lr=finetune_lr,
        finetune_warmup=finetune_warmup,
        pose=pose,
        pose_chunks=pose_chunks,
        logn=logn,
        factors=factors,
        search=search,
        search_budget=search_budget,
        search_seed=search_seed,
        search_tokens=search_tokens,
        window=window,
        group=group,
        leaky=leaky,
        threads=threads,
        layers=layers,
    )
    with _Displays(factor, finetune=finetune_steps > 0, search=search) as displays:
        outcome = api.extend(
            run_dir,
            out,
            evaluate=evaluate,
            callback=displays.train_event,
            progress=displays.search_progress,
            status=displays.status,
            **request,
        )
    result = outcome.result
    if outcome.remapped:
        console.print(remap_table(result))  # type: ignore[arg-type]
    else:
        console.print(summary_table(result))  # type: ignore[arg-type]
    if getattr(result, "kept_types", ()):  # a transformers directory whose layer types were scaled apart
        scaled, kept = ", ".join(result.scaled_types), ", ".join(result.kept_types)  # type: ignore[union-attr]
        console.print(f"--layers {result.layers}: scaled {scaled}; kept {kept} unchanged", highlight=False)  # type: ignore[union-attr]
    if search and not outcome.interrupted:
        console.print(search_line(outcome), highlight=False)
    if outcome.pose_span is not None:
        console.print(
            f"PoSE: fine-tuned on {result.train_length}-token windows, position ids spanning {outcome.pose_span}"
        )
    if outcome.interrupted:
        # deferred: keeps this command's modules off posenc --help start-up
        from posenc_cli.run.progress import interrupted_message

        assert result.finetune is not None  # type: ignore[union-attr]
        err_console.print(f"[yellow]{escape(interrupted_message(result.finetune))}[/]", highlight=False)  # type: ignore[union-attr]
        raise typer.Exit(128 + (result.finetune.signal or 2))  # type: ignore[union-attr]
    if outcome.evaluation is not None:
        console.print(evaluation_table(outcome.evaluation))


class _Displays:
    """The progress shown while `api.extend` runs: the search's transient bar (stderr, on a terminal), closed before
    the fine-tune's live display (stdout) opens, which closes before the evaluations' spinner, as rich runs one live
    display at a time."""

    def __init__(self, factor: float, *, finetune: bool, search: bool) -> None:
        self.factor = factor
        self.bar: Any = None
        self.display: Any = None
        self.spinner: Any = None
        if finetune:
            # deferred: keeps this command's modules off posenc --help start-up
            from posenc_cli.run.progress import TrainDisplay

            self.display = TrainDisplay(console, live=stdout_is_terminal(), log_every=1)
        self.search_progress = self._search_progress if search else None
        self.train_event = self._train_event if self.display is not None else None
        self._entered = False

    def __enter__(self) -> _Displays:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_bar()
        self._close_display(*exc)
        if self.spinner is not None:
            self.spinner.stop()
            self.spinner = None

    def _search_progress(self, done: int, total: int, best: float) -> None:
        if self.bar is None:
            self.bar = progress_bar()
            self.bar.start()
            self.task = self.bar.add_task(f"LongRoPE search ×{self.factor:g}", total=total)
        self.bar.update(self.task, completed=done, total=total,
                        description=f"LongRoPE search ×{self.factor:g} · best ppl {best:.4g}")  # fmt: skip

    def _train_event(self, event: dict[str, Any]) -> None:
        self._close_bar()
        if not self._entered:
            self.display.__enter__()
            self._entered = True
        self.display(event)

    def status(self, message: str) -> None:
        """`--eval`: "evaluating <dir> ..." under a spinner, once the other displays are closed."""
        self._close_bar()
        self._close_display(None, None, None)
        if self.spinner is None:
            self.spinner = console.status(escape(message), spinner="dots")
            self.spinner.start()
        else:
            self.spinner.update(escape(message))

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def _close_display(self, *exc: object) -> None:
        if self._entered:
            self.display.__exit__(*exc)
            self._entered = False
