"""`posenc bench`: training tokens/s vs transformers' Llama, matmul peak and MFU, long-context eval speed and memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table

from posenc_cli import api
from posenc_cli.cli.app import ConfigDirOption, app, console, err_console, handles_errors, split_args
from posenc_cli.errors import ConfigError


@app.command(
    "bench",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Example: posenc bench model=small --vs hf --json bench.json   (CPU without bf16 units: --dtypes fp32)\n\n"
    "Cost curve: posenc bench --eval-lengths 1024,4096,16384,65536 --plot cost.png --csv cost.csv",
)
@handles_errors
def bench_command(
    args: Annotated[list[str] | None, typer.Argument(help="Overrides, e.g. model=small train.seq_len=256.")] = None,
    vs: Annotated[
        str | None, typer.Option("--vs", metavar="hf", help="Also train transformers' Llama with matching dims.")
    ] = None,
    json_path: Annotated[str | None, typer.Option("--json", metavar="PATH", help="Write the results as JSON.")] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Interleaved rounds per training case.")] = 5,
    dtypes: Annotated[
        str | None,
        typer.Option(
            "--dtypes", help="Comma-separated fp32, bf16 (CPUs without bf16 units emulate it, slowly). [default: both]"
        ),
    ] = None,
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths", help="Eval lengths as multiples of train.seq_len (comma-separated). [default: 1,8,32]"
        ),
    ] = None,
    schemes: Annotated[
        str | None,
        typer.Option(
            "--schemes",
            help="Schemes of the eval cases. [default: nope,rope,alibi; with --eval-lengths every registered scheme]",
        ),
    ] = None,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the evaluation cases.")] = False,
    no_train: Annotated[bool, typer.Option("--no-train", help="Skip the training cases.")] = False,
    round_seconds: Annotated[
        float, typer.Option("--round-seconds", min=0.0, help="Target duration of one case in one round.")
    ] = 1.0,
    eval_lengths: Annotated[
        str | None,
        typer.Option(
            "--eval-lengths",
            metavar="N,N,...",
            help="The cost curve instead: time per token and peak memory of an eval forward (batch 1) at these "
            "lengths in tokens, every scheme, in train.precision.",
        ),
    ] = None,
    memory_limit: Annotated[
        float, typer.Option("--memory-limit", metavar="GIB", help="Cost curve: no case beyond this memory.")
    ] = 24.0,
    time_budget: Annotated[
        float | None,
        typer.Option(
            "--time-budget",
            metavar="SECONDS",
            help="Wall time of the whole benchmark (default: none); cost curve: per scheme (default 300). 0: none.",
        ),
    ] = None,
    csv_path: Annotated[
        str | None, typer.Option("--csv", metavar="PATH", help="Cost curve: write the rows as CSV.")
    ] = None,
    plot_path: Annotated[
        str | None,
        typer.Option("--plot", metavar="PATH", help="Cost curve: time and memory vs length (png, svg, pdf)."),
    ] = None,
    config_dir: ConfigDirOption = None,
) -> None:
    """Measure training throughput (posenc vs transformers' Llama), matmul peak, MFU and long-context evaluation.

    Training cases run in one process, in interleaved rounds (posenc, Llama, matmul probe, then reversed), and report
    medians, plus the steadier paired figures (ratio and MFU within each round);
    each evaluation case (scheme × length) runs in its own process so its peak memory is its own. Device, threads
    and sizes come from the config (model=..., train.seq_len, train.batch_size, train.device, train.threads).
    """
    names, overrides = split_args(args)
    if names:
        raise ConfigError(f"unexpected argument '{names[0]}' (overrides look like key=value)")
    if vs not in (None, "hf"):
        raise ConfigError(f"--vs {vs}: the only baseline is 'hf' (transformers' LlamaForCausalLM)")
    if eval_lengths is None:
        refused = [flag for flag, value in (("--csv", csv_path), ("--plot", plot_path)) if value is not None]
        if refused:
            raise ConfigError(f"{refused[0]} writes the cost curve: it needs --eval-lengths")
    else:
        for flag, value in (("--vs", vs), ("--dtypes", dtypes), ("--lengths", lengths)):
            if value is not None:
                hint = " (the curve runs in train.precision=fp32|bf16|auto)" if flag == "--dtypes" else ""
                raise ConfigError(f"{flag} does not apply to the cost curve (--eval-lengths){hint}")
    cfg = api.train_config(overrides, config_dir=config_dir)  # a bad override before a bad flag value, as always
    if eval_lengths is not None:
        budget = 300.0 if time_budget is None else time_budget
        curve_command(cfg, eval_lengths, schemes, memory_limit, budget, json_path, csv_path, plot_path)
        return
    opts = BenchFlags(
        dtypes=_items(dtypes or "fp32,bf16", "--dtypes"),
        train=not no_train,
        eval=not no_eval,
        eval_schemes=_items(schemes or "nope,rope,alibi", "--schemes"),
        eval_multiples=tuple(_ints(lengths or "1,8,32", "--lengths")),
    )
    with err_console.status("benchmarking") as status:
        result = api.bench(
            cfg,
            rounds=rounds,
            dtypes=opts.dtypes,
            vs_hf=vs == "hf",
            train=opts.train,
            evaluate=opts.eval,
            schemes=opts.eval_schemes,
            multiples=opts.eval_multiples,
            round_seconds=round_seconds,
            time_budget=time_budget,
            json_path=json_path,
            progress=lambda message: status.update(message),
        )
    render(result, opts)
    if json_path:
        console.print(f"wrote {json_path}", highlight=False)


@dataclass(frozen=True)
class BenchFlags:
    """What `render` reads of the flags: the dtypes asked for and which kinds of case ran."""

    dtypes: tuple[str, ...]
    train: bool
    eval: bool
    eval_schemes: tuple[str, ...]
    eval_multiples: tuple[int, ...]


def _items(text: str, option: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise ConfigError(f"{option} needs at least one value")
    return items


def _ints(text: str, option: str) -> list[int]:
    try:
        return [int(x) for x in _items(text, option)]
    except ValueError as e:
        raise ConfigError(f"{option}: expected comma-separated integers, got '{text}'") from e


def render(result: dict[str, Any], opts: Any) -> None:
    c = result["config"]
    console.print(
        f"{result['device']}, threads {result.get('threads')}, torch {result['torch']}; d={c['d_model']}, "
        f"{c['n_layer']} layers, {c['n_head']} heads, vocab {c['vocab_size']}, T={c['seq_len']}, "
        f"batch {c['batch_size']}, pos={c['pos']}; load average {result['load_average_start']} -> "
        f"{result['load_average_end']}",
        highlight=False,
    )
    dtypes = [d for d in opts.dtypes if d in result]
    if opts.train:
        console.print(training_table(result, dtypes))
        for line in paired_lines(result, dtypes):
            console.print(line, highlight=False)
        console.print(f"MFU: model FLOPs/token = {result['flops_per_token_formula']}", highlight=False)
        if "hf_differences" in result:
            console.print(result["hf_differences"], highlight=False)
    if opts.eval:
        console.print(eval_table(result, dtypes))
    for d in dtypes:
        if "skipped" in result[d]:
            console.print(f"{d}: skipped ({result[d]['skipped']})", highlight=False)
        elif result[d].get("emulated_on_this_cpu"):
            console.print(
                f"{d}: this CPU has no bf16 matrix instructions; PyTorch emulates bf16 ({result[d]['rounds']} rounds)",
                highlight=False,
            )


def training_table(result: dict[str, Any], dtypes: list[str]) -> Table:
    table = Table(title="Training (median tokens/s over interleaved rounds)")
    for col in ("dtype", "posenc tok/s", "Llama tok/s", "ratio", "matmul peak GFLOP/s", "MFU", "Llama MFU"):
        table.add_column(col, justify="left" if col == "dtype" else "right")
    for d in dtypes:
        r = result[d]
        if "posenc_tokens_per_s" not in r:
            continue
        table.add_row(
            d,
            _num(r["posenc_tokens_per_s"]),
            _num(r.get("hf_tokens_per_s")),
            _fmt(r.get("ratio_vs_hf"), "{:.2f}x"),
            _num(r["matmul_peak_gflops"]),
            _fmt(r.get("mfu"), "{:.0%}"),
            _fmt(r.get("hf_mfu"), "{:.0%}"),
        )
    return table


def paired_lines(result: dict[str, Any], dtypes: list[str]) -> list[str]:
    """Per dtype, the paired estimates: medians over rounds of posenc/Llama and of MFU vs that round's probe."""
    lines = []
    for d in dtypes:
        r = result[d]
        if "mfu_vs_same_round_probe" not in r:
            continue
        ratio = r.get("ratio_vs_hf_same_round")
        parts = [f"posenc/Llama {ratio:.2f}x"] if ratio is not None else []
        parts.append(f"MFU {r['mfu_vs_same_round_probe']:.0%} of the same round's probe")
        lines.append(f"{d}, paired per round (median over {r.get('rounds', '?')} rounds): " + ", ".join(parts))
    return lines


def eval_table(result: dict[str, Any], dtypes: list[str]) -> Table:
    table = Table(title="Evaluation forward (own process per case): tokens/s and peak resident MiB")
    table.add_column("scheme")
    table.add_column("length", justify="right")
    for d in dtypes:
        table.add_column(f"{d} tok/s", justify="right")
        table.add_column(f"{d} MiB", justify="right")
    rows: dict[tuple[str, int], list[str]] = {}
    for i, d in enumerate(dtypes):
        for scheme, by_length in (result[d].get("eval") or {}).items():
            for length, r in by_length.items():
                row = rows.setdefault((scheme, int(length)), ["-", "-"] * len(dtypes))
                row[2 * i], row[2 * i + 1] = _num(r["tokens_per_s"]), _num(r["peak_mem_mb"])
    for (scheme, length), cells in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        table.add_row(scheme, str(length), *cells)
    return table


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else spec.format(x)


# ----------------------------------------------------------------------------------------------------------------
# The cost curve (--eval-lengths).

CURVE_MARKS = {"not measured": "–", "cannot measure": "n/a", "failed": "failed"}
CURVE_LEGEND = (
    "– = not measured (a limit: reasons below); n/a = the scheme cannot read that many tokens; failed = the case "
    "crashed"
)


def curve_command(
    cfg: Any,
    eval_lengths: str,
    schemes: str | None,
    memory_limit: float,
    time_budget: float,
    json_path: str | None,
    csv_path: str | None,
    plot_path: str | None,
) -> None:
    """`posenc bench --eval-lengths ...`: measure and write the JSON, CSV and plot asked for (`api.cost_curve`), print
    both tables and what was written."""
    with err_console.status("measuring the cost curve") as status:
        result = api.cost_curve(
            cfg,
            lengths=_ints(eval_lengths, "--eval-lengths"),
            schemes=_items(schemes, "--schemes") if schemes is not None else None,
            memory_limit=memory_limit,
            time_budget=time_budget,
            json_path=json_path,
            csv_path=csv_path,
            plot_path=plot_path,
            progress=lambda message: status.update(message),
        )
    render_curve(result)
    for path in (json_path, csv_path, plot_path):
        if path:
            console.print(f"wrote {path}", highlight=False)


def render_curve(result: dict[str, Any]) -> None:
    c = result["config"]
    limit = result["memory_limit_applied_gib"]
    budget = result["time_budget_s"]
    console.print(
        f"{result['device']}, threads {result.get('threads')}, {result['precision']} "
        f"(train.precision={result['precision_setting']}), torch {result['torch']}; d={c['d_model']}, "
        f"{c['n_layer']} layers, {c['n_head']} heads, vocab {c['vocab_size']}, trained length {c['train_length']}, "
        f"batch 1; memory limit {limit:g} GiB"
        + (
            f" (asked {result['memory_limit_gib']:g}, this machine had {result['memory_available_gib']:g} available)"
            if limit < result["memory_limit_gib"]
            else ""
        )
        + (f", time budget {budget:g} s per scheme" if budget else ", no time budget")
        + f"; load average {result['load_average_start']} -> {result['load_average_end']}",
        highlight=False,
    )
    console.print(curve_table(result, "us_per_token", "Time per token (µs), eval forward, batch 1", "{:,.1f}"))
    console.print(curve_table(result, "peak_mib", f"Peak memory (MiB; {result['memory_measure']})", "{:,.0f}"))
    for line in curve_reasons(result):
        console.print(line, highlight=False)


def curve_table(result: dict[str, Any], key: str, title: str, spec: str) -> Table:
    """Schemes × lengths of one measure; the last column is the longest length measured within the memory limit."""
    lengths = result["lengths"]
    table = Table(title=title, caption=CURVE_LEGEND, title_justify="left", caption_justify="left")
    table.add_column("scheme")
    for n in lengths:
        table.add_column(f"{n:,}", justify="right")
    table.add_column(f"longest within {result['memory_limit_applied_gib']:g} GiB", justify="right")
    cells: dict[str, dict[int, str]] = {}
    for r in result["rows"]:
        text = spec.format(r[key]) if r["status"] == "measured" else f"[dim]{CURVE_MARKS[r['status']]}[/]"
        cells.setdefault(r["scheme"], {})[r["length"]] = text
    for scheme in result["schemes"]:
        table.add_row(scheme, *(cells[scheme].get(n, "") for n in lengths), reach_text(result["reach"][scheme]))
    return table


def reach_text(entry: dict[str, Any]) -> str:
    """'≥ 65,536 (all asked)', '≥ 8,192 (time budget)', '16,384 (memory)', '8,192 (failed beyond)', 'none (n/a)'."""
    stop = entry["stop"]
    if entry["longest"] is None:
        why = {"cannot": "n/a", "failed": "failed", "memory": "memory", "time": "time budget"}.get(stop)
        return f"none ({why})" if why else "none"
    n = f"{entry['longest']:,}"
    return {
        None: f"≥ {n} (all asked)",
        "time": f"≥ {n} (time budget)",
        "memory": f"{n} (memory)",
        "cannot": f"{n} (n/a beyond)",
    }.get(stop, f"{n} (failed beyond)")


def curve_reasons(result: dict[str, Any]) -> list[str]:
    """One line per scheme that was not measured at every length: from which length, and why."""
    return [
        f"{scheme}: from {entry['beyond']:,} tokens {entry['stopped_by']}"
        for scheme, entry in result["reach"].items()
        if entry["beyond"] is not None
    ]
