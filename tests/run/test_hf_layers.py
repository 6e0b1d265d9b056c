"""hf_layers: transformers checkpoints with per-layer layouts (sliding, chunked, NoPE, rope per layer type) evaluate
through posenc with the model's own masks, to plain transformers' logits and perplexity; their training length."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hf_layer_utils import CONTEXT, LAYERED, WINDOW, LazyModels, save_layered_model
from hf_utils import write_text_corpus

pytest.importorskip("transformers")

from posenc_cli.run.hf_layers import HFLayout, train_length
from posenc_cli.run.hf_run import _config_length, load_hf_run

S, F, C = "sliding_attention", "full_attention", "chunked_attention"
# The same weights without the layout: every window, chunk and NoPE layer turned into a plain global RoPE layer.
FLAT = {
    "gemma3": {"sliding_window": 10_000},
    "smollm3": {"no_rope_layers": [1, 1, 1, 1]},
    "qwen2_swa": {"layer_types": [F, F, F]},
    "mistral": {"sliding_window": None},
    "llama4": {"attention_chunk_size": 10_000, "no_rope_layers": [1, 1]},
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return LazyModels(tmp_path_factory.mktemp("hf-layers"))


def _plain(path: Path, **kwargs: object) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), **kwargs).eval()


@pytest.mark.parametrize(
    ("arch", "types", "rope", "length"),
    [
        ("gemma3", (S, S, F), (True,) * 3, CONTEXT),  # mixed: the global layer attends over the whole context
        ("smollm3", (F,) * 4, (True, True, True, False), CONTEXT),
        ("qwen2_swa", (F, S, S), (True,) * 3, CONTEXT),
        ("mistral", (S, S), (True, True), WINDOW),  # every layer windowed: the window (microsoft/LongRoPE's rule)
        ("llama4", (C, F), (True, False), CONTEXT),
    ],
)
def test_layout_and_training_length_are_read_as_transformers_reads_them(
    dirs: dict[str, Path], arch: str, types: tuple[str, ...], rope: tuple[bool, ...], length: int
) -> None:
    run = load_hf_run(dirs[arch])
    from posenc_cli.run.hf_run import inspect_hf_dir

    layout = inspect_hf_dir(dirs[arch]).layout
    assert layout is not None and (layout.types, layout.rope) == (types, rope)
    assert layout.rope_types == ((S, F) if arch == "gemma3" else ())
    assert run.meta.train_length == run.meta.base_length == length
    assert run.meta.record["layers"] == layout.describe() and run.meta.record["attention"] == "sdpa"


def test_nested_rope_parameters_give_the_global_layers_original_length() -> None:
    """Gemma 3 with YaRN on its global layers: their original length, not the local layers' nor the context."""
    rope = {
        F: {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 16},
        S: {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 4},
    }
    raw = {"model_type": "gemma3_text", "num_hidden_layers": 3, "sliding_window": 8, "max_position_embeddings": 64,
           "layer_types": [S, S, F], "rope_parameters": rope}  # fmt: skip
    assert _config_length(raw) == 16
    plain_global = {F: {"rope_type": "default", "rope_theta": 1e6}, S: rope[S]}
    assert _config_length({**raw, "rope_parameters": plain_global}) == 64  # the context, not the local 4
    layout = HFLayout(types=(S, S), rope=(True, True), window=100)  # a window longer than the context
    assert train_length({"max_position_embeddings": 64}, layout) == 64
    assert _config_length({"model_type": "gemma3_text", "max_position_embeddings": 64, "num_hidden_layers": 12}) == 64


@pytest.mark.parametrize("arch", LAYERED)
def test_logits_are_transformers_own_with_its_windows_and_nope_layers(dirs: dict[str, Path], arch: str) -> None:
    """posenc's logits = plain transformers' (SDPA and eager) at 5 windows' length; the same weights without the
    layout give other logits, so neither path silently attends globally or rotates every layer."""
    run = load_hf_run(dirs[arch])
    ids = torch.randint(0, 250, (2, 5 * WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = run.model(ids)
        torch.testing.assert_close(ours, _plain(dirs[arch])(input_ids=ids).logits, rtol=0, atol=1e-5)
        eager = _plain(dirs[arch], attn_implementation="eager")(input_ids=ids).logits
        torch.testing.assert_close(ours, eager, rtol=0, atol=1e-4)
        flat = _plain(dirs[arch], **FLAT[arch])(input_ids=ids).logits
    span_only = arch in ("gemma3", "qwen2_swa", "mistral")  # FLAT only widens the span
    first = WINDOW if span_only else 0
    assert (ours[:, first:] - flat[:, first:]).abs().amax() > 1e-3
    if span_only:  # within the first window a window changes nothing
        torch.testing.assert_close(ours[:, :WINDOW], flat[:, :WINDOW], rtol=0, atol=1e-5)


def _transformers_ppl(path: Path, stream: torch.Tensor, length: int, windows: int) -> float:
    """Perplexity of plain transformers on `windows` back-to-back windows of `length` from the start of `stream`."""
    model, nll = _plain(path), []
    with torch.no_grad():
        for w in range(windows):
            chunk = stream[w * length : w * length + length + 1][None]  # (1, L+1)
            logits = model(input_ids=chunk[:, :-1]).logits[0]  # (L, V)
            nll.append(torch.nn.functional.cross_entropy(logits.double(), chunk[0, 1:], reduction="sum"))
    return math.exp(float(sum(nll)) / (windows * length))


@pytest.mark.parametrize("arch", ["gemma3", "qwen2_swa", "mistral"])
def test_cli_perplexity_equals_plain_transformers(dirs: dict[str, Path], tmp_path: Path, arch: str) -> None:
    """`posenc eval-extrapolate DIR` as a user runs it, against transformers' own loss on the same tokens."""
    from typer.testing import CliRunner

    from posenc_cli.cli import app
    from posenc_cli.evaluation.corpus import CorpusCache, data_config_with_overrides

    corpus = write_text_corpus(tmp_path)
    data = ["data=text", f"data.paths=[{corpus}]", "data.val_fraction=0.5"]
    out = tmp_path / "all.json"
    args = ["eval-extrapolate", str(dirs[arch]), "--lengths", "1,4", "--tokens", "128", "--json", str(out), *data]
    result = CliRunner().invoke(app, [*args, "--force"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    entries = json.loads(out.read_text())["runs"][0]["entries"]
    run = load_hf_run(dirs[arch])
    stream = CorpusCache().get(data_config_with_overrides(run.config.data, data), run).val
    stream = torch.as_tensor(stream.astype("int64"))
    L = run.meta.train_length
    assert [e["length"] for e in entries] == [L, 4 * L] and all(e["status"] == "ok" for e in entries)
    for entry in entries:
        length = entry["length"]
        expected = _transformers_ppl(dirs[arch], stream, length, math.ceil(128 / length))
        assert entry["ppl"] == pytest.approx(expected, rel=1e-4)


def test_a_config_transformers_refuses_is_one_line_before_loading(tmp_path: Path) -> None:
    """A YaRN entry without its factor: transformers' own validation refuses it; posenc says so in one line."""
    from typer.testing import CliRunner

    from posenc_cli.cli import app
    from posenc_cli.errors import CheckpointError

    path = save_layered_model(tmp_path / "m", "gemma3")
    raw = json.loads((path / "config.json").read_text())
    raw["rope_parameters"][F] = {"rope_type": "yarn", "rope_theta": 1e6}
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config.json is not a valid gemma3_text config \(") as err:
        load_hf_run(path)
    assert "\n" not in str(err.value)
    result = CliRunner().invoke(app, ["eval-extrapolate", str(path), "--lengths", "1"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert not (path / "eval").exists()
