"""FoX: the forget-gate bias equals the per-pair sum of the paper (float64 loop), in the model and a KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.positional.fox import FoxConfig, forget_bias, gate_bias_init, log_forget_gates
from posenc_cli.run.config_load import config_from_dict


def naive_fox_logits(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wf: torch.Tensor, bf: torch.Tensor):
    """float64, pair by pair: z_ij = q_i·k_j/√d + Σ_{l=j+1..i} log σ(w_f·x_l + b_f), −inf for j > i (Eq. 6-7)."""
    x, wq, wk, wf, bf = (t.double() for t in (x, wq, wk, wf, bf))
    T, _ = x.shape
    H, d = wf.shape[0], wq.shape[0] // wf.shape[0]
    q = (x @ wq.t()).view(T, H, d)
    k = (x @ wk.t()).view(T, H, d)
    out = torch.full((H, T, T), float("-inf"), dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            for j in range(i + 1):
                decay = sum(torch.nn.functional.logsigmoid(wf[h] @ x[m] + bf[h]) for m in range(j + 1, i + 1))
                out[h, i, j] = q[i, h] @ k[j, h] / d**0.5 + decay
    return out


def test_bias_is_the_sum_of_log_gates_between_key_and_query() -> None:
    log_f = torch.log(torch.tensor([0.9, 0.5, 0.25, 0.8]))[None, None, :, None]  # (1, 1, 4, 1)
    pos = torch.arange(4)
    bias = forget_bias(log_f, pos, pos)[0, 0]
    for i in range(4):
        for j in range(i + 1):
            expected = log_f[0, 0, j + 1 : i + 1, 0].sum()
            torch.testing.assert_close(bias[i, j], expected, atol=1e-6, rtol=0)


def test_model_logits_equal_the_float64_per_pair_reference() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_layer=1, n_head=2, dropout=0.0)
    model = GPT(cfg, FoxConfig(), vocab_size=11, train_length=8).eval()
    with torch.no_grad():
        model.scheme.gate_weight.normal_(std=0.5)
        model.scheme.gate_bias.normal_(std=1.0)
    idx = torch.randint(0, 11, (1, 7))
    attn = model.blocks[0].attn
    x = model.blocks[0].norm1(model.wte(idx))[0]  # (T, D), the layer's input
    wq, wk, _ = attn.qkv.weight.split(cfg.d_model, dim=0)
    ref = naive_fox_logits(x, wq, wk, model.scheme.gate_weight[0], model.scheme.gate_bias[0])
    captured = {}
    real_bias = model.scheme.bias

    def spy(layer, q, k, q_pos, k_pos, ctx):
        b = real_bias(layer, q, k, q_pos, k_pos, ctx)
        captured["z"] = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5 + b.double()
        return b

    model.scheme.bias = spy
    with torch.no_grad():
        model(idx)
    z = captured["z"][0]  # (H, T, T)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(z[:, causal], ref[:, causal], atol=1e-5, rtol=0)


def test_gates_are_fp32_under_autocast() -> None:
    x = torch.randn(1, 3, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_f = log_forget_gates(x, torch.randn(2, 8), torch.zeros(2))
    assert log_f.dtype == torch.float32 and log_f.shape == (1, 2, 3, 1) and bool((log_f < 0).all())


def test_kv_cache_decoding_equals_the_full_forward_with_and_without_rope() -> None:
    for rope in (False, True):
        torch.manual_seed(1)
        cfg = ModelConfig(d_model=16, n_layer=2, n_head=2, dropout=0.0)
        model = GPT(cfg, FoxConfig(rope=rope), vocab_size=11, train_length=8).eval()
        with torch.no_grad():
            model.scheme.gate_weight.normal_(std=0.5)
        idx = torch.randint(0, 11, (2, 9))
        with torch.no_grad():
            full = model(idx)
            cache = model.new_cache()
            parts = [model(idx[:, :4], cache=cache), model(idx[:, 4:5], cache=cache), model(idx[:, 5:], cache=cache)]
        torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_rope_option_rotates_and_the_plain_one_does_not() -> None:
    cfg = ModelConfig(d_model=16, n_layer=1, n_head=2)
    assert "rotate" in GPT(cfg, FoxConfig(rope=True), 11, 8).scheme.hooks
    assert "rotate" not in GPT(cfg, FoxConfig(), 11, 8).scheme.hooks


def test_config_from_the_command_line() -> None:
    cfg = config_from_dict({"pos": {"name": "fox", "rope": True}})
    assert isinstance(cfg.pos, FoxConfig) and cfg.pos.rope
    assert not config_from_dict({"pos": {"name": "fox"}}).pos.rope  # off by default, as the reference's use_rope
    with pytest.raises(ConfigError, match="window"):  # a misspelt option is refused, not ignored
        config_from_dict({"pos": {"name": "fox", "window": 4}})


def test_decay_time_start_gives_each_head_log_f_of_minus_one_over_t() -> None:
    """The reference's fgate_bias_init formula: log σ(b_h) = −1/T_h, T log-uniform over [min, max] across heads."""
    bias = gate_bias_init(4, 16.0, 128.0)
    times = torch.logspace(math.log10(16.0), math.log10(128.0), 4, dtype=torch.float64)
    torch.testing.assert_close(torch.nn.functional.logsigmoid(bias.double()), -1.0 / times, atol=1e-6, rtol=1e-5)
    assert torch.equal(gate_bias_init(4, 0.0, 0.0), torch.zeros(4))  # the default: every gate at σ(0) = 1/2


def test_the_model_starts_every_layer_with_the_decay_time_bias() -> None:
    model = GPT(
        ModelConfig(d_model=32, n_layer=2, n_head=4), FoxConfig(decay_time_min=8.0, decay_time_max=64.0), 11, 16
    )
    expected = gate_bias_init(4, 8.0, 64.0)
    assert all(torch.equal(row, expected) for row in model.scheme.gate_bias.detach())
    plain = GPT(ModelConfig(d_model=32, n_layer=2, n_head=4), FoxConfig(), 11, 16)
    assert torch.count_nonzero(plain.scheme.gate_bias) == 0


@pytest.mark.parametrize(("low", "high"), [(16.0, 8.0), (0.0, 8.0), (-1.0, 8.0), (8.0, 0.0)])
def test_decay_times_are_both_zero_or_an_ordered_positive_range(low: float, high: float) -> None:
    with pytest.raises(ConfigError, match="pos.decay_time_min"):
        FoxConfig(decay_time_min=low, decay_time_max=high).validate()
