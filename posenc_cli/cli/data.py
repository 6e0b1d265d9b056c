"""`posenc data`: prepare the token cache of the configured corpus and summarise it."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.progress import TaskID
from rich.table import Table

from posenc_cli import api
from posenc_cli.cli.app import ConfigDirOption, app, console, handles_errors, progress_bar, split_args
from posenc_cli.errors import ConfigError


@app.command("data", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@handles_errors
def data_command(
    args: Annotated[list[str] | None, typer.Argument(help="Overrides, e.g. data=text data.paths=\\[notes/].")] = None,
    config_dir: ConfigDirOption = None,
) -> None:
    """Prepare and summarise the token cache. Example: posenc data data=text data.paths=\\[notes/] tokenizer=bpe"""
    names, overrides = split_args(args)
    if names:
        hint = f"for a corpus use data=text data.paths=[{names[0]}]"
        raise ConfigError(f"posenc data takes only KEY=VALUE overrides, got '{names[0]}' ({hint})")
    with progress_bar("{task.description:<18}") as bar:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        info = api.prepare_data(overrides, config_dir=config_dir, progress=progress)
    console.print(summary_table(info))


def _splits(values: dict[str, int]) -> str:
    return f"{values['train']:,} train / {values['val']:,} val"


def files_note(files: int, documents: dict[str, int]) -> str:
    """'1,790 (28 empty files skipped: no document)': why the file count is not the document count. In data=stdlib
    every non-empty file is one document (undecodable bytes are replaced, not dropped) and empty ones (most
    `__init__.py`) are skipped; a lone document is cut into train and val."""
    skipped = files - documents["train"] - documents["val"]
    return (
        f"{files:,} ({skipped:,} empty file{'s' if skipped != 1 else ''} skipped: no document)"
        if skipped > 0
        else f"{files:,}"
    )


def summary_table(info: dict[str, Any]) -> Table:
    """One row per fact of a prepared corpus (`Corpus.info`)."""
    table = Table(title="posenc data", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    source = info["source"]
    if source == "stdlib":
        table.add_row("source", f"stdlib: Python {info['python_version']} at {info['root']}")
    elif source == "text":
        table.add_row("source", f"text: {', '.join(info['paths'])}")
    elif source == "passkey":
        table.add_row(
            "source",
            f"passkey: {info['episodes']:,} episodes of {info['min_len']}–{info['max_len']} chars, "
            f"{info['digits']}-digit keys, seed {info['seed']}",
        )
    elif source == "tasks":
        share = f", {info['corpus_share']:.0%} {info['corpus']} text" if info["corpus_share"] else ""
        table.add_row(
            "source",
            f"tasks: {info['episodes']:,} documents of {info['min_len']}–{info['max_len']} chars "
            f"({', '.join(info['tasks'])}; {info['haystack']} haystack{share}), seed {info['seed']}",
        )
    else:
        config = f" ({info['config']})" if info.get("config") else ""
        table.add_row("source", f"hf: {info['name']}{config}, split {info['split']}")
    if "files" in info:
        table.add_row("files", files_note(info["files"], info["documents"]))
    table.add_row("documents", _splits(info["documents"]))
    table.add_row("bytes", _splits(info["bytes"]))
    table.add_row("tokens", _splits(info["tokens"]))
    if info.get("longest_prompt") is not None:  # prompt/answer examples: what a task's 1× prompt must not exceed
        table.add_row(
            "longest example",
            f"{info['longest_example']:,} tokens, its prompt up to {info['longest_prompt']:,} (train; a row of "
            "train.packing=none holds one example, and a task's 1× prompt longer than these was never trained on)",
        )
    if info.get("longest_prompt_by_task"):  # a mixture: each task's own bound
        by_task = ", ".join(f"{task} {n:,}" for task, n in info["longest_prompt_by_task"].items())
        table.add_row("longest prompt by task", f"{by_task} tokens (train)")
    table.add_row("split", info["split_method"])
    table.add_row("fingerprint", info["fingerprint"])
    table.add_row("tokenizer", f"{info['tokenizer']} (vocab {info['vocab_size']}, {info['tokenizer_fingerprint']})")
    table.add_row("cache", f"{info['cache_path']} ({info['dtype']})")
    table.add_row("time", f"{info['seconds']:.2f} s")
    reused = "yes: reused, nothing tokenized" if info["reused"] else "no: tokenized and written now"
    table.add_row("cache reused", reused)
    return table
