"""hf_extend on transformers directories with per-layer layouts: rope parameters scaled per layer type (Gemma 3's
global layers by default, `--layers all` every type), written so plain transformers loads them; refusals."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from hf_layer_utils import CONTEXT, LazyModels, save_layered_model
from typer.testing import CliRunner

pytest.importorskip("transformers")

from posenc_cli.cli import app
from posenc_cli.errors import ConfigError
from posenc_cli.extension.hf_extend import RECORD_FILE, scaled_layer_types
from posenc_cli.run.hf_layers import HFLayout
from posenc_cli.run.hf_run import load_hf_run

S, F = "sliding_attention", "full_attention"
runner = CliRunner()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return LazyModels(tmp_path_factory.mktemp("hf-extend-layers"))


def _extend(*args: str):
    return runner.invoke(app, ["extend", *args], env={"COLUMNS": "200"})


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def _plain(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path)).eval()


def _check_logits(src: Path, out: Path) -> None:
    """Plain transformers on the new directory = posenc's logits; both differ from the parent's beyond L (the
    scaling reached the rotary tables, which transformers computes when the model is built)."""
    ids = torch.randint(0, 250, (1, 4 * CONTEXT), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = _plain(out)(input_ids=ids).logits
        torch.testing.assert_close(load_hf_run(out).model(ids), plain, rtol=0, atol=1e-4)
        parent = _plain(src)(input_ids=ids).logits
    assert (plain - parent).abs().amax() > 1e-3


def _inv_freq(path: Path, layer_type: str) -> torch.Tensor:
    return getattr(_plain(path).model.rotary_emb, f"{layer_type}_inv_freq").double()


def test_yarn_scales_only_gemma3s_global_layers_by_default(sources: dict[str, Path], tmp_path: Path) -> None:
    from posenc_cli.rope_scaling.frequencies import scaled_inv_freq

    src, out = sources["gemma3"], tmp_path / "ext"
    before = _digest(src)
    result = _extend(str(src), "--yarn", "--factor", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "--layers global: scaled full_attention; kept sliding_attention unchanged" in result.output
    assert _digest(src) == before
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope[F]["rope_type"] == "yarn" and rope[F]["factor"] == 4.0
    assert rope[F]["original_max_position_embeddings"] == CONTEXT and rope[F]["rope_theta"] == 1e6
    assert rope[S] == {"rope_type": "default", "rope_theta": 1e4}
    record = json.loads((out / RECORD_FILE).read_text())
    assert record["layers"] == "global" and record["scaled_layer_types"] == [F]
    _check_logits(src, out)
    ours, _ = scaled_inv_freq("yarn", 8, 1e6, 4.0, CONTEXT)  # head_dim 8
    torch.testing.assert_close(_inv_freq(out, F), ours.double(), rtol=1e-6, atol=0)
    torch.testing.assert_close(_inv_freq(out, S), _inv_freq(src, S), rtol=0, atol=0)


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic", "llama3"])
def test_other_methods_scale_the_global_layers_too(sources: dict[str, Path], tmp_path: Path, method: str) -> None:
    src, out = sources["gemma3"], tmp_path / "ext"
    result = _extend(str(src), f"--{method}", "--factor", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope[F]["rope_type"] == {"ntk": "default"}.get(method, method) and rope[S]["rope_type"] == "default"
    assert (rope[F]["rope_theta"] > 1e6) == (method == "ntk")
    _check_logits(src, out)


def test_layers_all_scales_every_layer_type(sources: dict[str, Path], tmp_path: Path) -> None:
    src, out = sources["gemma3"], tmp_path / "ext"
    result = _extend(str(src), "--yarn", "--factor", "4", "--layers", "all", "--out", str(out))
    assert result.exit_code == 0, result.output
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope[F]["rope_type"] == rope[S]["rope_type"] == "yarn" and rope[S]["rope_theta"] == 1e4
    assert json.loads((out / RECORD_FILE).read_text())["layers"] == "all"
    _check_logits(src, out)
    assert not torch.allclose(_inv_freq(out, S), _inv_freq(src, S))
    other = _extend(str(src), "--yarn", "--factor", "4", "--out", str(out))  # the default rule, same --out
    assert other.exit_code == 2 and "layers: all there, global asked" in " ".join(other.output.split())


def test_a_gemma3_config_in_the_released_format_extends(tmp_path: Path) -> None:
    """google/gemma-3-*: rope_theta 1e6, rope_local_base_freq 1e4, rope_scaling linear x8 (the global layers')."""
    src = save_layered_model(tmp_path / "src", "gemma3")
    raw = json.loads((src / "config.json").read_text())
    del raw["rope_parameters"]
    raw.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})
    (src / "config.json").write_text(json.dumps(raw))
    assert load_hf_run(src).meta.train_length == CONTEXT  # linear names no original length: the context
    out = tmp_path / "ext"
    result = _extend(str(src), "--yarn", "--factor", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "parent scaling replaced" in result.output
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope[F]["rope_type"] == "yarn" and rope[F]["rope_theta"] == 1e6
    assert rope[S] == {"rope_type": "default", "rope_theta": 1e4}
    _check_logits(src, out)


@pytest.mark.parametrize("arch", ["qwen2_swa", "mistral"])
def test_one_rope_set_serving_windowed_layers_needs_layers_all(
    sources: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    """Qwen2 with a global and two windowed layers, Mistral with every layer windowed: one set of rope parameters,
    which "global" cannot split (refused, nothing written); "all" scales it whole."""
    src, out = sources[arch], tmp_path / "ext"
    refused = _extend(str(src), "--yarn", "--out", str(out))
    assert refused.exit_code == 2, refused.output
    why = "scales it whole" if arch == "qwen2_swa" else "no global layer rotates"
    assert len(refused.output.strip().splitlines()) == 1 and why in refused.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".ext")]
    result = _extend(str(src), "--yarn", "--layers", "all", "--out", str(out))
    assert result.exit_code == 0, result.output
    record = json.loads((out / RECORD_FILE).read_text())
    assert record["layers"] == "all" and record["scaled_layer_types"] == ([F, S] if arch == "qwen2_swa" else [S])
    original = json.loads((out / "config.json").read_text())["rope_parameters"]["original_max_position_embeddings"]
    assert original == (CONTEXT if arch == "qwen2_swa" else 8)  # Mistral: the window is the training length
    _check_logits(src, out)


def test_a_model_whose_every_layer_attends_globally_is_scaled_whole(tmp_path: Path) -> None:
    """SmolLM3 (NoPE every 4th layer, full attention everywhere): one rope set, scaled under the default rule."""
    src, out = save_layered_model(tmp_path / "src", "smollm3"), tmp_path / "ext"
    result = _extend(str(src), "--yarn", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / RECORD_FILE).read_text())["scaled_layer_types"] == [F]
    assert json.loads((out / "config.json").read_text())["no_rope_layers"] == [1, 1, 1, 0]
    _check_logits(src, out)


def test_an_unknown_layers_rule_is_one_line(sources: dict[str, Path], tmp_path: Path) -> None:
    result = _extend(str(sources["gemma3"]), "--yarn", "--layers", "local", "--out", str(tmp_path / "ext"))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "must be one of global, all, got 'local'" in result.output and not (tmp_path / "ext").exists()


def test_scaled_layer_types_rules() -> None:
    gemma = HFLayout(types=(S, S, F), rope=(True,) * 3, window=8, rope_types=(S, F))
    assert scaled_layer_types(gemma, "global", Path("m")) == (F,)
    assert scaled_layer_types(gemma, "all", Path("m")) == (S, F)
    llama = HFLayout(types=(F, F), rope=(True, True))
    assert scaled_layer_types(llama, "global", Path("m")) == scaled_layer_types(llama, "all", Path("m")) == ()
    nope_global = HFLayout(types=(S, F), rope=(True, False), window=8, rope_types=(S,))  # nested, NoPE global
    with pytest.raises(ConfigError, match=r"global layers \(full_attention\) have no rope parameters"):
        scaled_layer_types(nope_global, "global", Path("m"))
    assert scaled_layer_types(nope_global, "all", Path("m")) == (S,)
    irope = HFLayout(types=("chunked_attention", F), rope=(True, False), chunk=8)  # Llama 4: one set, NoPE global
    with pytest.raises(ConfigError, match=r"no global layer rotates \(its RoPE layers: chunked_attention\)"):
        scaled_layer_types(irope, "global", Path("m"))
    assert scaled_layer_types(irope, "all", Path("m")) == ()
    with pytest.raises(ConfigError, match="--layers must be one of global, all, got 'local'"):
        scaled_layer_types(gemma, "local", Path("m"))


def test_a_record_from_before_layers_is_still_this_extension(tmp_path: Path) -> None:
    """An extension written before `layers` was recorded (one rope set, scaled whole) re-runs as a no-op."""
    src, out = save_layered_model(tmp_path / "src", "smollm3"), tmp_path / "ext"
    assert _extend(str(src), "--yarn", "--out", str(out)).exit_code == 0
    record = json.loads((out / RECORD_FILE).read_text())
    del record["layers"], record["scaled_layer_types"]
    (out / RECORD_FILE).write_text(json.dumps(record))
    again = _extend(str(src), "--yarn", "--out", str(out))
    assert again.exit_code == 0 and "already extended" in again.output, again.output


def test_the_flag_reaches_posencs_own_layouts(tmp_path: Path) -> None:
    """`--layers` is one flag for both: an iRoPE run (chunked RoPE layers, NoPE global ones) is refused under the
    default and extended under `--layers all`, as `extension.rope_layers` rules."""
    from train_utils import tiny_config, write_corpus

    from posenc_cli.run.train import train

    (tmp_path / "src").mkdir()
    cfg = tiny_config(write_corpus(tmp_path / "src"), pos="irope", model={"n_layer": 4}, steps=1, eval_every=1,
                      save_every=1)  # fmt: skip
    train(cfg, tmp_path / "src" / "run")
    run, out = tmp_path / "src" / "run", tmp_path / "ext"
    refused = _extend(str(run), "--yarn", "--out", str(out))
    assert refused.exit_code == 2 and "--layers all scales the windowed ones" in refused.output, refused.output
    result = _extend(str(run), "--yarn", "--layers", "all", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "meta.json").read_text())["extend"]["layers"]["rule"] == "all"
