"""PoPE (posenc_cli/positional/pope.py): the logits against a float64 per-pair loop of the formula at the references'
scale, the attention output through the model's kernel, δ's clamp, relativity, selection, a CLI run and an exact
resume. The registry contract (causality, KV cache, ids, bf16, chunks) is tested in `test_scheme_contract.py`."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from attention_utils import force_chunks
from train_utils import metrics, same_weights, tiny_config, tiny_overrides, weights, write_corpus
from typer.testing import CliRunner

from posenc_cli.attention import attend
from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.model import GPT
from posenc_cli.positional import PositionContext, build_scheme
from posenc_cli.positional.pope import PoPE, PopeConfig, pope_inv_freq

TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)  # head dim 16
H, D = TINY.n_head, TINY.head_dim


def scheme(**cfg: object) -> PoPE:
    s = build_scheme(PopeConfig(**cfg), TINY, 16)
    assert isinstance(s, PoPE)
    return s


def context(ids: torch.Tensor | None, T: int) -> PositionContext:
    if ids is None:
        return PositionContext(torch.arange(T))
    return PositionContext(ids, index=torch.arange(T), max_position=int(ids.max()))


def softplus64(x: float) -> float:
    return math.log1p(math.exp(x))


def reference_logits(q: torch.Tensor, k: torch.Tensor, ids: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """The formula pair by pair, in float64 Python: logit_bhij = Σ_c softplus(q_bhic)·softplus(k_bhjc)·
    cos((id_j − id_i)·θ_c + clamp(δ_hc, −2π, 0)) / √d, θ_c = 10000^(−c/d); ids (B, T)."""
    B, H, T, d = q.shape
    theta = [10000.0 ** (-c / d) for c in range(d)]
    out = torch.zeros(B, H, T, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            dl = [min(max(float(delta[h, c]), -2 * math.pi), 0.0) for c in range(d)]
            for i in range(T):
                for j in range(T):
                    s = 0.0
                    for c in range(d):
                        mq, mk = softplus64(float(q[b, h, i, c])), softplus64(float(k[b, h, j, c]))
                        s += mq * mk * math.cos((int(ids[b, j]) - int(ids[b, i])) * theta[c] + dl[c])
                    out[b, h, i, j] = s / math.sqrt(d)
    return out


def qk(B: int, T: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)


@pytest.mark.parametrize("ids_kind", ["default", "shared", "per-row"])
def test_logits_equal_the_per_pair_formula_at_the_references_scale(ids_kind: str) -> None:
    """q'·k'ᵀ under SDPA's 1/√(2d) is the formula's logit at 1/√d (PoPE-pytorch, x-transformers), with δ partly
    outside [−2π, 0] (clamped), and explicit ids (T,) or one row per sequence (B, T). Ids stay below ~50 here: the
    phases are fp32, as in both references, so at id p they carry p·2⁻²⁴ of rounding (larger ids: the shift test)."""
    B, T = 2, 6
    s = scheme()
    with torch.no_grad():
        s.phase_bias.copy_(torch.linspace(-8.0, 1.5, H * D).view(H, D))  # some below −2π, some above 0
    ids = {
        "default": None,
        "shared": torch.tensor([0, 2, 3, 7, 8, 40]),
        "per-row": torch.tensor([[40, 41, 43, 44, 49, 50], [3, 1, 4, 1, 5, 9]]),
    }[ids_kind]
    ctx = context(ids, T)
    s.prepare(ctx)
    q, k = qk(B, T)
    q2, k2 = s.rotate(q, k, ctx)
    assert q2.shape == k2.shape == (B, H, T, 2 * D)
    got = (q2.double() @ k2.double().transpose(-1, -2)) / math.sqrt(2 * D)  # what SDPA computes
    full_ids = (torch.arange(T) if ids is None else ids).expand(B, T)
    torch.testing.assert_close(got, reference_logits(q, k, full_ids, s.phase_bias.detach()), rtol=0, atol=1e-5)


def test_attention_through_the_models_kernel_equals_the_formulas_softmax() -> None:
    """The whole road: `attend` (fused SDPA, causal) on PoPE's q', k' of width 2d and v of width d."""
    B, T = 2, 7
    s = scheme(bias_init="uniform")
    ctx = context(None, T)
    s.prepare(ctx)
    q, k = qk(B, T, seed=1)
    v = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(2))
    q2, k2 = s.rotate(q, k, ctx)
    out = attend(q2, k2, v, s, 0, ctx)  # (B, H, T, d)
    logits = reference_logits(q, k, torch.arange(T).expand(B, T), s.phase_bias.detach())
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    ref = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1) @ v.double()
    assert out.shape == (B, H, T, D)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)


def test_frequencies_are_one_per_component() -> None:
    theta = pope_inv_freq(16)
    assert theta.shape == (16,) and theta[0] == 1.0
    torch.testing.assert_close(theta[5], torch.tensor(10000.0 ** (-5 / 16)))


def test_logits_read_only_id_differences() -> None:
    """relative: ids shifted by 1000 give the same logits (to the fp32 rounding of the phases)."""
    T = 8
    s = scheme(bias_init="uniform")
    q, k = qk(1, T, seed=3)
    ids = torch.tensor([0, 1, 2, 5, 6, 9, 10, 11])
    out = []
    for shift in (0, 1000):
        ctx = context(ids + shift, T)
        s.prepare(ctx)
        q2, k2 = s.rotate(q, k, ctx)
        out.append(q2 @ k2.transpose(-1, -2))
    assert PoPE.relative and PoPE.extrapolates
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-3)  # phases ~1000 rad in fp32: ulp 6e-5


def test_an_optimizer_step_past_the_range_leaves_the_forward_at_the_clamped_phase() -> None:
    """δ is clamped to [−2π, 0] in the forward (pope.py line 145 of PoPE-pytorch); the parameter may leave the range,
    the forward never does, and no gradient reaches the clamped entries."""
    torch.manual_seed(0)
    model = GPT(TINY, PopeConfig(bias_init="uniform"), 48, 16).eval()
    delta = model.scheme.phase_bias
    opt = torch.optim.SGD([delta], lr=1.0)
    delta.grad = torch.where(torch.arange(H * D).view(H, D) % 2 == 0, -10.0, 10.0)  # half up past 0, half down
    opt.step()
    assert (delta > 0).any() and (delta < -2 * math.pi).any()
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(idx)
        clamped = delta.clamp(-2 * math.pi, 0.0)
        in_range = GPT(TINY, PopeConfig(), 48, 16).eval()
        in_range.load_state_dict({**model.state_dict(), "scheme.phase_bias": clamped})
        assert torch.equal(out, in_range(idx))
        delta.copy_(torch.where(delta > 0, delta + 3.0, delta - 3.0))  # further out: still the same forward
        assert torch.equal(model(idx), out)
    model.zero_grad()
    model(idx).sum().backward()
    assert torch.all(delta.grad == 0)  # every entry is outside [−2π, 0]: the clamp passes nothing


def test_bias_init_and_validation() -> None:
    assert torch.all(scheme().phase_bias == 0)
    torch.manual_seed(0)
    u = scheme(bias_init="uniform").phase_bias
    assert u.shape == (H, D) and (u <= 0).all() and (u >= -2 * math.pi).all() and u.std() > 1
    with pytest.raises(ConfigError, match="pos.base"):
        PopeConfig(base=1.0).validate()
    with pytest.raises(ConfigError, match="pos.bias_init"):
        PopeConfig(bias_init="normal").validate()  # type: ignore[arg-type]


def test_selectable_through_hydra() -> None:
    from posenc_cli.run.config_compose import compose_config

    cfg = compose_config(["pos=pope", "pos.bias_init=uniform", "pos.base=500"])
    assert isinstance(cfg.pos, PopeConfig) and cfg.pos.bias_init == "uniform" and cfg.pos.base == 500.0


def test_queries_and_keys_double_their_width_and_values_keep_theirs() -> None:
    model = GPT(TINY, PopeConfig(), 48, 16).eval()
    idx = torch.randint(0, 48, (1, 9))
    ctx = model.context(idx)
    attn = model.blocks[0].attn
    q, k, v = attn.qkv_heads(model.blocks[0].norm1(model.embed(idx, ctx)), model.scheme, ctx)
    assert q.shape == k.shape == (1, H, 9, 2 * D) and v.shape == (1, H, 9, D)


@pytest.mark.parametrize("span", ["sliding", "chunked"])
def test_a_layout_layer_with_a_span_attends_with_the_wide_queries(span: str) -> None:
    """A PoPE layer of `pos=layout` with a window or chunks: its own road (Windowed, BlockCausal) equals the
    windowed road forced by query chunks."""
    from posenc_cli.positional import config_class

    torch.manual_seed(0)
    layers = [{"name": "pope", "span": span, "window": 5, "bias_init": "uniform"}, {"name": "pope"}]
    model = GPT(TINY, config_class("layout")(layers=layers), 48, 16).eval()
    idx = torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(idx)
        force_chunks(model, 3)
        torch.testing.assert_close(model(idx), out, rtol=1e-5, atol=1e-5)


# -- a run from the CLI, and an exact resume ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def test_trains_from_the_cli(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.cli import app

    out = tmp_path / "run"
    args = [o for o in tiny_overrides(corpus, steps=3, eval_every=3, save_every=3) if o != "pos=nope"]
    result = CliRunner().invoke(app, ["train", *args, "pos=pope", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "meta.json").read_text())["status"] == "complete"
    assert [step for step, *_ in metrics(out)] == [1, 2, 3]
    assert "scheme.phase_bias" in weights(out)


def test_an_interrupted_run_resumes_bitwise(corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.run.train import train

    cfg = tiny_config(corpus, pos="pope", steps=6, save_every=4, eval_every=6)
    train(cfg, tmp_path / "ref")

    def stop_at_3(event: dict) -> None:
        if event["event"] == "step" and event["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    stopped = train(cfg, tmp_path / "run", callback=stop_at_3)
    assert stopped.stopped_reason == "interrupted" and stopped.step == 3
    done = train(cfg, tmp_path / "run", resume=True)
    assert done.stopped_reason == "complete" and done.step == 6
    assert same_weights(weights(tmp_path / "run"), weights(tmp_path / "ref"))
    assert metrics(tmp_path / "run") == metrics(tmp_path / "ref")
    assert not torch.equal(weights(tmp_path / "ref")["scheme.phase_bias"], torch.zeros(H, D))  # δ trained


def test_bf16_training_step_on_cpu_gives_finite_gradients() -> None:
    """bf16 autocast with gradients takes the fp32 road on CPU (`InFp32`), with q, k twice v's width."""
    torch.manual_seed(0)
    model = GPT(TINY, PopeConfig(bias_init="uniform"), 48, 16).train()
    data = torch.randint(0, 48, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(data[:, :-1]).float().flatten(0, 1), data[:, 1:].flatten())
    loss.backward()
    grad = model.scheme.phase_bias.grad
    assert torch.isfinite(loss) and grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
