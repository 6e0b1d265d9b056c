"""`posenc extend --method self-extend|rerope` through Typer's CliRunner: the child records pos.remap, equals its
parent within the window, evaluates at 4x; refusals exit 2 with one line and write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import RemapConfig
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli-remap")
    corpus = write_corpus(root)
    out = {}
    for pos, steps in (("rope", 6), ("alibi", 2)):
        out[pos] = root / pos
        train(tiny_config(corpus, pos=pos, steps=steps), out[pos])
    return out


def invoke(*args: str):
    return runner.invoke(app, ["extend", *args], env={"COLUMNS": "200"})


def test_self_extend_child_records_the_remap_and_evaluates_at_4x(runs: dict[str, Path], tmp_path: Path) -> None:
    result = invoke(str(runs["rope"]), "--method", "self-extend", "--window", "8", "--group", "4")
    assert result.exit_code == 0, result.output
    out = runs["rope"].with_name("rope-self-extend-w8g4")  # the default directory, next to the parent
    assert "self-extend W=8 G=4" in result.output and "copied unchanged" in result.output
    assert "largest relative position at 64 tokens" in result.output  # 4×16: 15//4 + 8 - 2 = 21
    child, parent = load_run(out), load_run(runs["rope"])
    assert child.config.pos.remap == RemapConfig(method="self-extend", window=8, group=4)  # type: ignore[attr-defined]
    assert child.meta.files["model.safetensors"] == parent.meta.files["model.safetensors"]
    assert child.meta.record["extend"]["remap"] == {"method": "self-extend", "window": 8, "group": 4, "leaky": 0.0}
    again = invoke(str(runs["rope"]), "--method", "self-extend", "--window", "8", "--group", "4")
    assert again.exit_code == 0 and "nothing to do" in again.output
    other = invoke(str(runs["rope"]), "--method", "self-extend", "--window", "8", "--group", "2", "--out", str(out))
    assert other.exit_code == 2 and "different extension (other remap.group: 4 there, 2 asked)" in " ".join(
        other.output.split()
    )

    report = tmp_path / "eval.json"
    ev = runner.invoke(
        app, ["eval-extrapolate", str(out), "--lengths", "1,4", "--tokens", "256", "--json", str(report)],
        terminal_width=200,
    )  # fmt: skip
    assert ev.exit_code == 0, ev.output
    assert str(64) in ev.output  # the 4× column


def test_rerope_child_equals_its_parent_within_the_window(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "rerope"
    result = invoke(str(runs["rope"]), "--method", "rerope", "--window", "12", "--leaky", "8", "--out", str(out))
    assert result.exit_code == 0, result.output
    child, parent = load_run(out), load_run(runs["rope"])
    assert child.config.pos.remap.describe() == "rerope W=12 k=8"  # type: ignore[attr-defined]
    idx = torch.randint(0, 200, (2, 12))
    with torch.no_grad():
        assert torch.equal(child.model(idx), parent.model(idx))
        long = torch.randint(0, 200, (1, 48))
        assert not torch.equal(child.model(long), parent.model(long))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--method", "self-extend", "--window", "8", "--group", "4"),
            "uses pos=alibi; self-extend (a RoPE remapping) applies only to RoPE",
        ),
        (("--method", "rerope", "--window", "8"), "uses pos=alibi; rerope (a RoPE remapping) applies only to RoPE"),
        (("--method", "rerope"), "needs --window W"),
        (("--method", "self-extend", "--window", "8"), "needs --group G"),
        (("--method", "rerope", "--window", "8", "--group", "2"), "--group belongs to --method self-extend"),
        (("--method", "self-extend", "--window", "8", "--group", "2", "--leaky", "4"), "--leaky belongs to"),
        (("--method", "rerope", "--window", "8", "--leaky", "1"), "leaky k must be > 1"),
        (("--method", "rerope", "--window", "0"), "--window must be in [1, 4194304], got 0"),
        (("--yarn", "--window", "8"), "--window belongs to --method self-extend or rerope"),
        (("--method", "rerope", "--window", "8", "--finetune-steps", "5"), "--finetune-steps does not apply"),
        (("--method", "rerope", "--window", "8", "--factor", "8"), "--factor does not apply"),
        (("--method", "rerope", "--window", "8", "--pose"), "--pose does not apply"),
        (("--yarn", "--method", "rerope", "--window", "8"), "give one method"),
    ],
)
def test_refusals_exit_2_and_write_nothing(
    args: tuple[str, ...], message: str, runs: dict[str, Path], tmp_path: Path
) -> None:
    run = runs["alibi"] if "alibi" in message else runs["rope"]
    out = tmp_path / "child"
    result = invoke(str(run), *args, "--out", str(out))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_a_remapped_run_is_not_remapped_again(runs: dict[str, Path], tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert invoke(str(runs["rope"]), "--method", "rerope", "--window", "8", "--out", str(first)).exit_code == 0
    result = invoke(str(first), "--method", "rerope", "--window", "4", "--out", str(tmp_path / "second"))
    assert result.exit_code == 2 and "already remaps positions (rerope W=8)" in result.output
    assert json.loads((first / "meta.json").read_text())["extend"]["method"] == "rerope"


def test_viz_attention_of_a_remapped_child(runs: dict[str, Path], tmp_path: Path) -> None:
    from posenc_cli.analysis import viz_data

    out = tmp_path / "se"
    assert (
        invoke(
            str(runs["rope"]), "--method", "self-extend", "--window", "4", "--group", "2", "--out", str(out)
        ).exit_code
        == 0
    )
    png = tmp_path / "attention.png"
    result = runner.invoke(app, ["viz", "attention", str(out), "--windows", "1", "--out", str(png)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    child, parent = load_run(out), load_run(runs["rope"])
    a = viz_data.attention_report(child, layer="0", head="0", windows=1)
    b = viz_data.attention_report(parent, layer="0", head="0", windows=1)
    (child_4x,) = [p for p in a.panels if p.multiple == 4.0]
    (parent_4x,) = [p for p in b.panels if p.multiple == 4.0]
    assert child_4x.length == 64 and child_4x.mass is not None and parent_4x.mass is not None
    np.testing.assert_allclose(child_4x.mass.sum(-1), 1.0, atol=1e-9)  # a distribution over distances
    assert np.abs(child_4x.mass - parent_4x.mass).max() > 1e-6  # the remapping changes attention beyond W = 4


def test_export_refuses_a_remapped_run(runs: dict[str, Path], tmp_path: Path) -> None:
    child, hf = tmp_path / "rr", tmp_path / "hf"
    assert invoke(str(runs["rope"]), "--method", "rerope", "--window", "8", "--out", str(child)).exit_code == 0
    result = runner.invoke(app, ["export", str(child), "--out", str(hf)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "not exportable: pos.remap (rerope W=8) has no counterpart" in " ".join(result.output.split())
    assert not hf.exists()


def test_eval_prints_parent_and_child_side_by_side(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "rr-eval"
    result = invoke(str(runs["rope"]), "--method", "rerope", "--window", "8", "--out", str(out), "--eval")
    assert result.exit_code == 0, result.output
    assert "Perplexity by evaluation length" in result.output
    rows = [line.split("│")[1].split()[0] for line in result.output.splitlines() if line.startswith("│ ")]
    assert {"rope", "rr-eval"} <= set(rows)  # the parent and the child
    assert (out / "eval" / "extrapolate.json").is_file() and not (runs["rope"] / "eval").exists()


def test_rerope_queries_carry_log_n_by_default_as_the_reference(runs: dict[str, Path], tmp_path: Path) -> None:
    """bojone/rerope multiplies every query by max(1, log(id + 1) / log L): the child's config says so, its meta
    records it, and the queries of its attention carry that factor (L = the parent's training length, 16)."""
    out = tmp_path / "rerope"
    result = invoke(str(runs["rope"]), "--method", "rerope", "--window", "8", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "log-n: max(1, log(i + 1) / log 16)" in result.output
    child, parent = load_run(out), load_run(runs["rope"])
    assert (child.config.model.attn_scale, child.config.model.logn_length) == ("logn", 16)
    assert child.meta.record["extend"]["logn"] == {"length": 16}
    queries, idx = {}, torch.randint(0, 200, (1, 64))
    for name, run in (("child", child), ("parent", parent)):
        attn = run.model.blocks[0].attn
        attn.register_forward_hook(lambda m, a, _out, name=name: queries.update({name: attn_queries(m, a)}))
        with torch.no_grad():
            run.model(idx)
    ids = torch.arange(64, dtype=torch.float64)
    factor = ((ids + 1).log() / np.log(16)).clamp(min=1.0)  # the reference's formula, (T,)
    torch.testing.assert_close(
        queries["child"].double(), queries["parent"].double() * factor[:, None], atol=1e-5, rtol=1e-5
    )

    plain = tmp_path / "plain"
    off = invoke(str(runs["rope"]), "--method", "rerope", "--window", "8", "--no-logn", "--out", str(plain))
    assert off.exit_code == 0, off.output
    assert load_run(plain).config.model.attn_scale == "none" and "logn" not in load_run(plain).meta.record["extend"]
    into = invoke(str(runs["rope"]), "--method", "rerope", "--window", "8", "--no-logn", "--out", str(out))
    assert into.exit_code == 2 and "other logn: {'length': 16} there, none asked" in " ".join(into.output.split())


def attn_queries(attn: torch.nn.Module, args: tuple) -> torch.Tensor:
    """The (T, hd) queries of head 0 that `attn` attends with (after rotation and length scaling), batch row 0."""
    x, scheme, ctx = args[:3]
    q, _, _ = attn.qkv_heads(x, scheme, ctx)
    return q[0, 0]


def test_self_extend_takes_no_log_n_unless_asked(runs: dict[str, Path], tmp_path: Path) -> None:
    """datamllab/LongLM's log-n is off by default (scale_base=-1); --logn turns it on (directory name says so)."""
    result = invoke(str(runs["rope"]), "--method", "self-extend", "--window", "8", "--group", "2", "--logn")
    assert result.exit_code == 0, result.output
    child = load_run(runs["rope"].with_name("rope-self-extend-w8g2-logn"))
    assert (child.config.model.attn_scale, child.config.model.logn_length) == ("logn", 16)
    plain = tmp_path / "se"
    assert (
        invoke(
            str(runs["rope"]), "--method", "self-extend", "--window", "8", "--group", "2", "--out", str(plain)
        ).exit_code
        == 0
    )
    assert load_run(plain).config.model.attn_scale == "none"
