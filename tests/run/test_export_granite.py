"""export_granite: posenc's RMSNorm block with learned attention sinks is transformers' Granite SWA exactly (with
sliding:full layouts, NoPE layers and YaRN-free RoPE); the options with no exact target are refused in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, write_corpus

pytest.importorskip("transformers")

from posenc_cli.config import Config
from posenc_cli.errors import NotExportable
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.export import architecture, check_exportable, export_run
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train


def _train(root: Path, pos: str) -> Path:
    """A 3-step 4-layer RMSNorm run with sinks (d = 32, 2 heads, L = 16) of `pos`."""
    root.mkdir()
    model = {"n_layer": 4, "norm": "rmsnorm", "attn_sinks": True}
    cfg = tiny_config(write_corpus(root), pos=pos, model=model, steps=3, eval_every=3, save_every=3)
    train(cfg, root / "run")
    return root / "run"


@pytest.mark.parametrize("pos", ["gpt-oss", "rnope-swa"])
def test_export_verifies_and_transformers_gives_posencs_logits(tmp_path: Path, pos: str) -> None:
    """`export_run` (its own logit check included), then the directory through AutoModelForCausalLM at 4x the
    training length, beyond the windows (4); without the sinks transformers gives other logits."""
    import transformers as tf

    run_dir = _train(tmp_path / "src", pos)
    result = export_run(run_dir, tmp_path / "hf")
    assert result.architecture == "GraniteSWAForCausalLM" and result.max_abs_diff is not None
    run = load_run(run_dir)
    plain = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert plain.config.sliding_window == 4 and "sliding_attention" in plain.config.layer_types
    if pos == "rnope-swa":
        assert plain.config.layer_rope_theta[-1] == 0.0  # the NoPE layer
    ids = torch.randint(0, run.tokenizer.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = run.model(ids), plain(input_ids=ids).logits
        torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)
        for layer in plain.model.layers:
            layer.self_attn.sinks.fill_(-1e4)  # a sink that takes no weight: plain softmax
        assert (plain(input_ids=ids).logits - ours).abs().amax() > 1e-3


def _config(norm: str = "rmsnorm", pos: str = "rope", **model: object) -> Config:
    return config_from_dict({"model": {"d_model": 32, "n_layer": 2, "n_head": 2, "norm": norm, **model},
                             "pos": {"name": pos}, "train": {"seq_len": 16}})  # fmt: skip


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"attn_sinks": True, "norm": "layernorm"}, "uses RMSNorm .* not GELU"),
        ({"qk_norm": "rms"}, "model.qk_norm=rms has no exact counterpart: .* no MLP biases"),
        ({"qk_norm": "l2", "attn_sinks": True}, "model.qk_norm=l2 has no exact counterpart"),
        ({"attn_gate": "elementwise"}, "model.attn_gate=elementwise .* Qwen3-Next"),
        ({"canon": "AC"}, "model.canon=AC .* no transformers architecture has Canon layers"),
    ],
)
def test_options_without_an_exact_target_are_refused_in_one_line(model: dict[str, object], message: str) -> None:
    with pytest.raises(NotExportable, match=message) as err:
        check_exportable(_config(**model))
    assert "\n" not in str(err.value)


def test_sinks_on_a_scheme_granite_cannot_hold_are_refused() -> None:
    cfg = _config(pos="alibi", attn_sinks=True)
    assert architecture(cfg) == "GraniteSWAForCausalLM"
    with pytest.raises(NotExportable, match="pos=alibi has no counterpart in GraniteSWAForCausalLM"):
        check_exportable(cfg)
    check_exportable(dataclasses.replace(_config(attn_sinks=True)))  # plain RoPE with sinks: exportable
