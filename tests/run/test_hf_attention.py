"""hf_run / hf_layers with the 2025-26 attention details: tiny GPT-OSS (learned sinks, sliding:full, YaRN), Qwen3
(QK-norm), Gemma 3 and Gemma 4 (QK-norm, v-norm, sliding:full, rope per layer type), Llama 4 (weightless QK-norm on
its chunked RoPE layers) and Qwen3-Next (output gate, zero-centred QK-norm, linear-attention layers) checkpoints read
as posenc runs: layout and details recorded, transformers' own logits and cached-decode tokens, parameters counted;
malformed ones refused in one line (exit 2) before any weight is read."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_layer_utils import CONTEXT, WINDOW, layered_config
from hf_utils import tiny_tokenizer

pytest.importorskip("transformers")

from posenc_cli.run.hf_run import check_size, config_parameters, load_hf_run, stored_parameters

S, F = "sliding_attention", "full_attention"
YARN = {"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": WINDOW}  # fmt: skip
# What meta's "layers" says beyond the layout (each architecture's own attention details) and the training length.
EXPECTED = {
    "gpt_oss": ("1 sliding_attention (window 8) + 1 full_attention; learned sinks (4,): all layers", WINDOW),
    "qwen3": ("2 full_attention; QK-norm (RMS per head, weight w): all layers", CONTEXT),
    "gemma3": ("QK-norm (RMS per head, weight (1 + w)): all layers", CONTEXT),
    "gemma4": (
        "1 full_attention; rope per layer type; QK-norm (RMS per head, weight w): all layers; v-norm "
        "(weightless RMS per head): all layers",
        CONTEXT,
    ),
    "llama4": ("NoPE: layer 2; QK-norm (weightless RMS per head): layer 1", CONTEXT),
    "qwen3_next": (
        "1 linear_attention + 1 full_attention; NoPE: layer 1; QK-norm (RMS per head, weight (1 + w)): "
        "layer 2; sigmoid output gate (elementwise, in q_proj): layer 2",
        CONTEXT,
    ),
}


def attention_config(arch: str, vocab: int, **extra: Any) -> Any:
    """A 2-3 layer, d = 32 config of `arch` (see `EXPECTED`) with its attention details on."""
    import transformers as tf

    if arch in ("gemma3", "llama4"):  # QK-norm is on by default in both (`use_qk_norm`: Llama 4's RoPE layers)
        return layered_config(arch, vocab, **extra)
    common = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": CONTEXT, "bos_token_id": 0,
              "eos_token_id": 0, "pad_token_id": 0, "initializer_range": 0.1}  # fmt: skip
    if arch == "gpt_oss":  # sinks on every layer; 1:1 sliding:full; YaRN over an original length of 8
        fields = {"num_hidden_layers": 2, "sliding_window": WINDOW, "layer_types": [S, F], "num_local_experts": 2,
                  "num_experts_per_tok": 1, "rope_parameters": YARN}  # fmt: skip
        return tf.GptOssConfig(**{**common, **fields, **extra})
    if arch == "qwen3":
        return tf.Qwen3Config(**{**common, "num_hidden_layers": 2, **extra})
    if arch == "gemma4":  # 2 sliding : 1 global; the global layer's proportional RoPE over its own head dim
        rope = {S: {"rope_type": "default", "rope_theta": 10_000.0},
                F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}  # fmt: skip
        fields = {"num_hidden_layers": 3, "sliding_window": WINDOW, "layer_types": [S, S, F],
                  "rope_parameters": rope, "global_head_dim": 16, "hidden_size_per_layer_input": 0,
                  "vocab_size_per_layer_input": vocab}  # fmt: skip
        return tf.Gemma4TextConfig(**{**common, **fields, **extra})
    if arch == "qwen3_next":  # a gated-delta-rule layer, then a gated full-attention layer
        fields = {"num_hidden_layers": 2, "layer_types": ["linear_attention", F], "num_experts": 2,
                  "num_experts_per_tok": 1, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
                  "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
                  "linear_value_head_dim": 8}  # fmt: skip
        return tf.Qwen3NextConfig(**{**common, **fields, **extra})
    raise ValueError(arch)


def save_attention_model(directory: Path, arch: str, *, seed: int = 0, **extra: Any) -> Path:
    """Random weights of a tiny `arch` model (`attention_config`) plus the tiny tokenizer, into `directory`."""
    import transformers as tf

    tok = tiny_tokenizer()
    cfg = attention_config(arch, len(tok), **extra)
    torch.manual_seed(seed)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return Path(directory)


class _Models(dict):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, arch: str) -> Path:
        self[arch] = save_attention_model(self.root / arch, arch)
        return self[arch]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Models(tmp_path_factory.mktemp("hf-attention"))


class _FullForward(torch.nn.Module):
    """The checkpoint without `decode_step`: one full forward per generated token."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(idx, position_ids=position_ids)


@pytest.mark.parametrize("arch", list(EXPECTED))
def test_read_with_details_logits_and_cached_tokens_of_transformers(dirs: dict[str, Path], arch: str) -> None:
    """meta's layout names the details; posenc's logits = transformers' own (fp32, 1e-4) past the windows, with and
    without position ids; greedy decoding through the model's cache gives the full forward's tokens."""
    from transformers import AutoModelForCausalLM

    from posenc_cli.evaluation.passkey import greedy_decode

    run = load_hf_run(dirs[arch])
    details, length = EXPECTED[arch]
    assert details in run.meta.record["layers"] and run.meta.train_length == length
    ids = torch.randint(1, 250, (2, 3 * WINDOW), generator=torch.Generator().manual_seed(0))  # (B, T)
    positions = torch.arange(3 * WINDOW).expand(2, -1)
    plain = AutoModelForCausalLM.from_pretrained(str(dirs[arch])).eval()
    with torch.no_grad():
        theirs = plain(input_ids=ids).logits
        torch.testing.assert_close(run.model(ids), theirs, rtol=0, atol=1e-4)
        torch.testing.assert_close(run.model(ids, position_ids=positions), theirs, rtol=0, atol=1e-4)
    assert run.model.uncached_reason() is None
    with torch.inference_mode():
        cached = greedy_decode(run.model, ids[:, :11], 6)
        full = greedy_decode(_FullForward(run.model), ids[:, :11], 6)
    assert torch.equal(cached, full)


@pytest.mark.parametrize("arch", list(EXPECTED))
def test_config_parameters_stay_below_the_weights(dirs: dict[str, Path], arch: str) -> None:
    raw = json.loads((dirs[arch] / "config.json").read_text())
    described = config_parameters(raw)
    assert described is not None and described <= stored_parameters(dirs[arch])
    check_size(dirs[arch], raw, available=2**40)  # not refused


def test_gpt_oss_experts_are_counted(dirs: dict[str, Path]) -> None:
    """A config naming 100,000 experts beside the weights of 2 is refused (the experts were once left out)."""
    from posenc_cli.errors import CheckpointError

    raw = json.loads((dirs["gpt_oss"] / "config.json").read_text())
    with pytest.raises(CheckpointError, match="does not belong to these weights"):
        check_size(dirs["gpt_oss"], {**raw, "num_local_experts": 100_000}, available=2**40)


def _edit_weights(path: Path, edit: Any) -> None:
    import safetensors.torch

    file = path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(file))
    edit(tensors)
    safetensors.torch.save_file(tensors, str(file), metadata={"format": "pt"})


def _edit_config(path: Path, **fields: Any) -> None:
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, **fields}))


def _drop(name: str) -> Any:
    return lambda t: t.pop(name)


def _resize(name: str, shape: tuple[int, ...]) -> Any:
    return lambda t: t.__setitem__(name, torch.zeros(shape))


MALFORMED = {
    # transformers' own validation (a type it does not know)
    "unknown layer type": ("gpt_oss", {"layer_types": [S, "banana_attention"]}, None, "not a valid gpt_oss config"),
    # a type transformers knows but GPT-OSS builds no mask for: its forward would raise KeyError
    "layer type without a mask": (
        "gpt_oss",
        {"layer_types": [S, "chunked_attention"]},
        None,
        "'chunked_attention', for which gpt_oss builds no attention mask",
    ),
    "sinks of the wrong shape": (
        "gpt_oss",
        {},
        _resize("model.layers.1.self_attn.sinks", (5,)),
        r"layers.1.self_attn.sinks has shape \[5\] in the weight files, but .* \[4\]",
    ),
    "gate width": (
        "qwen3_next",
        {},
        _resize("model.layers.1.self_attn.q_proj.weight", (48, 32)),
        r"layers.1.self_attn.q_proj.weight has shape \[48, 32\] .* needs \[64, 32\]",
    ),
    "missing QK-norm weight": (
        "qwen3",
        {},
        _drop("model.layers.0.self_attn.k_norm.weight"),
        "have no layers.0.self_attn.k_norm.weight",
    ),
    # Qwen3's weights under a Llama config: Llama has no QK-norm, transformers would drop the weights silently
    "QK-norm weights without a place": (
        "qwen3",
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
        None,
        r"hold layers.0.self_attn.k_norm.weight, which .* no place",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoints_are_refused_in_one_line_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    from typer.testing import CliRunner

    from posenc_cli.cli import app
    from posenc_cli.run import hf_run

    arch, fields, edit, message = MALFORMED[case]
    path = save_attention_model(tmp_path / "m", arch)
    if fields:
        _edit_config(path, **fields)
    if edit is not None:
        _edit_weights(path, edit)

    def never(info: object) -> None:
        raise AssertionError("weights were read")

    monkeypatch.setattr(hf_run, "_load_model", never)
    result = CliRunner().invoke(app, ["eval-extrapolate", str(path), "--lengths", "1"], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert re.search(message, result.output), result.output
