"""export_smollm3: posenc's RMSNorm block with per-layer RoPE/NoPE and sliding windows is SmolLM3 exactly
(transformers, the oracle, gives posenc's logits); what SmolLM3 cannot hold is refused in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, write_corpus

pytest.importorskip("transformers")

from posenc_cli.config import Config, replace
from posenc_cli.errors import NotExportable
from posenc_cli.run.config_load import config_from_dict
from posenc_cli.run.export_smollm3 import check_smollm3_exportable, smollm3_config_kwargs, smollm3_weights
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train


def _train(root: Path, pos: str, **pos_options: object) -> Path:
    """A 3-step 4-layer RMSNorm run (d = 32, 2 heads, L = 16) of `pos`, with `pos_options` replaced."""
    root.mkdir()
    cfg = tiny_config(write_corpus(root), pos=pos, model={"n_layer": 4, "norm": "rmsnorm"}, steps=3, eval_every=3,
                      save_every=3)  # fmt: skip
    train(replace(cfg, pos=replace(cfg.pos, **pos_options)), root / "run")
    return root / "run"


@pytest.mark.parametrize(
    ("pos", "options"),
    [("smollm3", {}), ("rnope-swa", {}), ("rope", {"layout": "interleaved", "base": 500.0})],
)
def test_transformers_gives_posencs_logits(tmp_path: Path, pos: str, options: dict[str, object]) -> None:
    """Through save_pretrained / from_pretrained, at 4x the training length (16): beyond rnope-swa's window (4)."""
    import transformers as tf

    run = load_run(_train(tmp_path / "src", pos, **options))
    check_smollm3_exportable(run.config)
    vocab = int(run.model.state_dict()["wte.weight"].shape[0])
    kwargs = smollm3_config_kwargs(run.config, vocab, eod_id=0)
    config = tf.SmolLM3Config(**kwargs)
    model = tf.SmolLM3ForCausalLM(config)
    weights = smollm3_weights(run.model.state_dict(), run.config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []  # the head is tied to the embedding
    model.save_pretrained(str(tmp_path / "hf"))
    plain = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, vocab, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = run.model(ids), plain(input_ids=ids).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)
    if pos == "rnope-swa":  # the window is SmolLM3's own: without it the logits differ
        assert config.layer_types == ["sliding_attention"] * 3 + ["full_attention"] and config.sliding_window == 4
        wide = tf.SmolLM3ForCausalLM(tf.SmolLM3Config(**{**kwargs, "layer_types": ["full_attention"] * 4})).eval()
        wide.load_state_dict(weights, strict=False)
        with torch.no_grad():
            assert (wide(input_ids=ids).logits - ours).abs().amax() > 1e-3


def _config(pos: str, norm: str = "rmsnorm", **pos_options: object) -> Config:
    return config_from_dict({"model": {"d_model": 32, "n_layer": 6, "n_head": 2, "norm": norm},
                             "pos": {"name": pos, **pos_options}, "train": {"seq_len": 16}})  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (lambda: _config("smollm3", norm="layernorm"), "model.norm=layernorm; no transformers architecture"),
        (lambda: _config("irope"), "chunked attention, which SmolLM3ForCausalLM does not"),
        (lambda: _config("gemma3"), "the RoPE layers differ in their options"),
        (lambda: _config("alibi"), "pos=alibi has no counterpart"),
        (lambda: _config("rope", rotary_fraction=0.5), "partial rotary"),
    ],
)
def test_what_smollm3_cannot_hold_is_refused_in_one_line(cfg: Callable[[], Config], message: str) -> None:
    with pytest.raises(NotExportable, match=message) as err:
        check_smollm3_exportable(cfg())
    assert "\n" not in str(err.value)


def test_an_unresolved_layout_takes_the_default_window() -> None:
    kwargs = smollm3_config_kwargs(_config("rnope-swa"), 64, eod_id=0)  # window_fraction 0.25 of L = 16
    assert kwargs["sliding_window"] == 4 and kwargs["no_rope_layers"] == [1, 1, 1, 0, 1, 1]
