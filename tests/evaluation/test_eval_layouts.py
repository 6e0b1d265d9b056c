"""Every evaluation from the CLI on tiny per-layer layout runs (irope at 4 layers, gemma3 at 6): finite results,
labelled with the preset's name, and the streaming cells a layer's span makes meaningless n/a with the reason."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()
HYBRIDS = {"irope": 4, "gemma3": 6}  # preset -> layers (the pattern's length)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 6-step run per preset (d_model 32, seq_len 16: windows and chunks of 4) under one sweep directory."""
    from posenc_cli.run.train import train

    root = tmp_path_factory.mktemp("eval-layouts")
    corpus = write_corpus(root)
    for name, n_layer in HYBRIDS.items():
        cfg = tiny_config(corpus, pos=name, model={"n_layer": n_layer}, steps=6, eval_every=6, save_every=6)
        train(cfg, root / "sweep" / name)
    return root / "sweep"


def run_cli(*args: object, out: Path) -> list[dict[str, Any]]:
    """Invoke posenc with `args` and --json `out`; the combined runs, sorted by name."""
    result = runner.invoke(app, [*map(str, args), "--device", "cpu", "--json", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    return sorted(json.loads(out.read_text())["runs"], key=lambda r: r["run"])


def assert_labelled(runs: list[dict[str, Any]], names: tuple[str, ...] = tuple(sorted(HYBRIDS))) -> None:
    assert [r["run"] for r in runs] == list(names) and [r["scheme"] for r in runs] == list(names)


@pytest.mark.parametrize("protocol", ["nonoverlap", "sliding", "fixed-target"])
def test_perplexity_protocols(sweep: Path, tmp_path: Path, protocol: str) -> None:
    runs = run_cli("eval-extrapolate", sweep, "--protocol", protocol, "--lengths", "1,2", "--tokens", 64,
                   "--no-longppl", out=tmp_path / "ppl.json")  # fmt: skip
    assert_labelled(runs)
    for run in runs:
        assert [(e["length"], e["status"]) for e in run["entries"]] == [(16, "ok"), (32, "ok")]
        assert all(math.isfinite(e["nll"]) and e["protocol"] == protocol for e in run["entries"])
    assert runs[0]["entries"][0]["nll"] != runs[1]["entries"][0]["nll"]


def test_streaming_measures_what_the_cache_honours(sweep: Path, tmp_path: Path) -> None:
    """gemma3's sliding windows (4) fit the cache's window (12): measured. irope's chunks do not survive eviction:
    n/a past the warm-up, with the layer and span named, and measured at 1× (one causal forward)."""
    args = ("eval-extrapolate", sweep, "--protocol", "streaming", "--lengths", "1,2", "--tokens", 64, "--no-longppl")
    result = runner.invoke(app, [*map(str, args), "--device", "cpu"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "n/a for irope at 32: layer 0's chunked 4 span" in result.output
    runs = run_cli(*args, out=tmp_path / "s.json")
    assert_labelled(runs)
    gemma3, irope = runs
    assert [e["status"] for e in gemma3["entries"]] == ["ok", "ok"]
    assert [e["status"] for e in irope["entries"]] == ["ok", "n/a"]
    assert all(math.isfinite(e["nll"]) for e in gemma3["entries"] + irope["entries"][:1])
    assert irope["entries"][1]["nll"] is None and "chunks would follow" in irope["entries"][1]["reason"]


def test_longppl(sweep: Path, tmp_path: Path) -> None:
    """Both layouts scored on gemma3's key tokens, the evaluator named relative to the sweep (looked up above each
    run's directory)."""
    args = ("eval-extrapolate", sweep, "--lengths", "1,4", "--tokens", 64, "--longppl-evaluator", "gemma3")
    runs = run_cli(*args, out=tmp_path / "l.json")
    assert_labelled(runs)
    assert len({run["entries"][1]["longppl_evaluator"]["keys"] for run in runs}) == 1
    for run in runs:
        short, long = run["entries"]
        assert short["key_tokens"] == 0 and short["longppl"] is None  # no target has more context than L
        assert long["status"] == "ok" and isinstance(long["key_tokens"], int) and long["key_tokens"] >= 0
        assert long["longppl"] is None if long["key_tokens"] == 0 else math.isfinite(long["longppl"])


def test_passkey(sweep: Path, tmp_path: Path) -> None:
    runs = run_cli(
        "eval-passkey", sweep, "--abs-lengths", 112, "--depths", "0,1", "--trials", 1, out=tmp_path / "p.json"
    )
    assert_labelled(runs)
    for run in runs:
        assert [e["status"] for e in run["entries"]] == ["ok", "ok"]
        assert all(e["trials"] == 1 and 0.0 <= e["accuracy"] <= 1.0 for e in run["entries"])


def test_tasks_niah_single(sweep: Path, tmp_path: Path) -> None:
    runs = run_cli("eval-tasks", sweep / "irope", "--tasks", "niah-single", "--abs-lengths", 96, "--depths", 0,
                   "--trials", 1, "--tokens-to-generate", 12, out=tmp_path / "t.json")  # fmt: skip
    assert_labelled(runs, ("irope",))
    (entry,) = runs[0]["entries"]
    assert entry["status"] == "ok" and entry["task"] == "niah-single" and 0.0 <= entry["score"] <= 1.0


def test_algorithmic(sweep: Path, tmp_path: Path) -> None:
    runs = run_cli("eval-algorithmic", sweep / "gemma3", "--tasks", "copy", "--lengths", "1,2", "--examples", 1,
                   out=tmp_path / "a.json")  # fmt: skip
    assert_labelled(runs, ("gemma3",))
    assert [(e["length"], e["status"]) for e in runs[0]["entries"]] == [(1, "ok"), (2, "ok")]


def test_grid_position_limit_reads_a_layouts_learned_table() -> None:
    """The retrieval grid's memory check skips lengths past a learned table, a layout's only scheme included."""
    from posenc_cli.evaluation.grid import position_limit
    from posenc_cli.positional import config_class
    from posenc_cli.positional.layout import LayoutConfig

    assert position_limit(config_class("learned")(name="learned"), 16) == 16
    assert position_limit(LayoutConfig(layers=[{"name": "learned", "table_size": 40}]), 16) == 40
    assert position_limit(LayoutConfig(layers=[{"name": "learned"}]), 16) == 16
    assert position_limit(config_class("irope")(name="irope"), 16) is None


class FullForward(torch.nn.Module):
    """The model without its KV cache: `greedy_decode` then runs one full forward per generated token."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(idx, position_ids=position_ids)


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_cached_greedy_decode_equals_full_forwards(name: str) -> None:
    """The retrieval evaluations' decode through the KV cache gives each layer its span and temperature at the
    tokens' own indexes: the same tokens as a full forward per step, past several windows and chunks."""
    from posenc_cli.config import ModelConfig
    from posenc_cli.evaluation.passkey import greedy_decode
    from posenc_cli.model import GPT
    from posenc_cli.positional import config_class

    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layer=HYBRIDS[name], n_head=2, init_std=0.3), config_class(name)(name=name),
                50, 16).eval()  # fmt: skip
    prompts = torch.randint(0, 50, (3, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cached = greedy_decode(model, prompts, 12, use_bf16=False)
        full = greedy_decode(FullForward(model), prompts, 12, use_bf16=False)
    assert torch.equal(cached, full) and len(set(cached.flatten().tolist())) > 3


def test_a_layouts_position_limit_is_its_learned_tables() -> None:
    """`max_length` of a layout whose one scheme is a learned table: every evaluation's n/a check reads it."""
    import numpy as np

    from posenc_cli.config import ModelConfig
    from posenc_cli.errors import LengthBeyondScheme
    from posenc_cli.evaluation.passkey import check_readable
    from posenc_cli.evaluation.perplexity.measuring import evaluate_model
    from posenc_cli.evaluation.streaming import evaluate_streaming
    from posenc_cli.model import GPT
    from posenc_cli.positional.layout import LayoutConfig

    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=2), LayoutConfig(layers=[{"name": "learned"}]), 50, 16)
    tokens = np.arange(200) % 50
    assert model.scheme.max_length == 16
    assert np.isfinite(evaluate_model(model, tokens, None, length=16, n_tokens=32)["nll"])
    for measure in (
        lambda: evaluate_model(model, tokens, None, length=17, n_tokens=34),
        lambda: evaluate_streaming(model, tokens, None, length=40, window=16, sinks=1, n_tokens=40),
        lambda: check_readable(model, 18),
    ):
        with pytest.raises(LengthBeyondScheme, match="supports at most 16 positions"):
            measure()
