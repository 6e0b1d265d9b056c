"""PoPE: polar coordinate positions (Gopalakrishnan, Csordás, Schmidhuber, Mozer 2025, arXiv 2509.10534).

Every one of the d = head_dim components of a query or key becomes a complex number whose magnitude is content
only and whose phase is position only: q̃_tc = softplus(q_tc)·e^{i·t·θ_c}, k̃_sc = softplus(k_sc)·e^{i(s·θ_c + δ_c)},
and the logit is Re(q̃_tᴴ k̃_s)/√d:

    logit_ts = Σ_c softplus(q_tc)·softplus(k_sc)·cos((s − t)·θ_c + δ_c) / √d

(= cos((t − s)·θ_c − δ_c): δ shifts the key's phase). RoPE's pairs rotate the content's own angle; here content
cannot move a phase, which is the paper's "what/where" decoupling. What the defaults follow (lucidrains' two
implementations, cited by commit):

- θ_c = base^(−c/d), c = 0..d−1: d frequencies, not d/2, base 10000 (PoPE-pytorch@ee11cab `PoPE_pytorch/pope.py`
  lines 98, 107; x-transformers@9252ed7 `x_transformers/x_transformers.py` lines 888, 891).
- softplus on the whole raw q and k, in fp32 (pope.py line 60; x_transformers.py lines 917-919).
- δ: a learned (H, d) phase bias on the keys only (pope.py lines 56, 77; x_transformers.py line 2371), one per head
  and component, shared by every layer (one module per model: x_transformers.py line 2790; PoPE-pytorch@0d4db2c
  `train_enwik8.py`, `SimpleTransformer.__init__`, builds one `PoPE` for all layers). Initialised to zeros, or
  uniform on [−2π, 0] with `pos.bias_init=uniform` (pope.py lines 113-116; x_transformers.py lines 894-897), and
  clamped to [−2π, 0] in the forward, the parameter itself left as the optimiser moves it (pope.py line 145;
  x_transformers.py line 908). Beyond the range the clamp passes no gradient, so a δ pushed out stays at the bound
  (no weight decay acts on scheme parameters, `run/optim.py`).
- The scale is 1/√d, d the head dim before the doubling: PoPE-pytorch computes its softmax scale from q before
  applying PoPE (`PoPE_pytorch/attention.py` lines 88, 114); x-transformers keeps `dim_head ** -0.5`
  (x_transformers.py line 1843) and multiplies q by that over (2d)^−½ (`x_transformers/attend.py` lines 375-377).

Cartesian form for the dot product: q' = (μ_q cos φ_t, μ_q sin φ_t), k' = (μ_k cos(φ_s + δ), μ_k sin(φ_s + δ)), both
(B, H, T, 2d) (the cos half then the sin half, as x_transformers.py line 920; PoPE-pytorch interleaves, the dot
product is the same), v stays (B, H, T, d). SDPA scales by 1/√(2d), so q' carries a factor √2 (folded into its
tables) to give the reference's 1/√d. Phases and magnitudes are fp32 (also under autocast); q', k' come back in
q's dtype. The tables (H·T·2d for the keys) are built once per forward and shared by every layer.

Position ids: t and s are the tokens' ids, (T,) or (B, T) (relative: the logit reads only s − t, up to the fp32
rounding of the phases). KV-cache decoding rotates the new query rows alone from the same tables
(`rotate_rows`: the last rows' phases, as pope.py line 64 and x_transformers.py line 915 slice them); cached keys
are stored raw, as for RoPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext

BiasInit = Literal["zeros", "uniform"]
PHASE_MIN = -2.0 * math.pi  # δ's range [−2π, 0] (pope.py line 145)


@dataclass(kw_only=True)
class PopeConfig(PosConfig):
    name: str = "pope"
    base: float = 10000.0
    bias_init: BiasInit = "zeros"  # the key phase bias δ at init: zeros, or uniform on [−2π, 0]

    def validate(self) -> None:
        if self.base <= 1:
            raise ConfigError(f"pos.base must be > 1, got {self.base}")
        if self.bias_init not in ("zeros", "uniform"):
            raise ConfigError(f"pos.bias_init must be zeros or uniform, got {self.bias_init!r}")


def pope_inv_freq(dim: int, base: float = 10000.0) -> Tensor:
    """(dim,) fp32 frequencies θ_c = base^(−c/dim), c = 0..dim−1 (one per component, not per pair)."""
    c = torch.arange(dim, dtype=torch.float64)
    return (base ** (-c / dim)).to(torch.float32)


def clamped_phase_bias(bias: Tensor) -> Tensor:
    """δ (H, d) -> fp32, clamped to [−2π, 0] (the value every forward uses)."""
    return bias.float().clamp(PHASE_MIN, 0.0)


def phase_tables(positions: Tensor, inv_freq: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
    """positions (T,) or (B, T), inv_freq (d,), δ (H, d) fp32 -> the fp32 tables `polar` multiplies by:

    query: (T, 2, d) or (B, 1, T, 2, d), (cos φ, sin φ)·√2 with φ = p·θ (the √2 turns SDPA's 1/√(2d) into 1/√d);
    key: (H, T, 2, d) or (B, H, T, 2, d), (cos(φ + δ), sin(φ + δ)).
    """
    phase = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)  # (T, d) or (B, T, d)
    q_tab = torch.stack([phase.cos(), phase.sin()], dim=-2) * math.sqrt(2.0)  # (..., T, 2, d)
    k_phase = phase.unsqueeze(-3) + delta[:, None, :]  # (H, T, d) or (B, H, T, d)
    k_tab = torch.stack([k_phase.cos(), k_phase.sin()], dim=-2)  # (..., H, T, 2, d)
    if q_tab.dim() == 4:  # (B, T, 2, d) -> (B, 1, T, 2, d): one row of ids per sequence
        q_tab = q_tab.unsqueeze(1)
    return q_tab, k_tab


def row_by_row(x: Tensor) -> Tensor:
    """x (..., d) -> the same values in memory where no row of d touches the next (a padded copy; CPU only).

    PyTorch's CPU kernels merge adjacent rows into one loop and compute the loop's last few elements with scalar
    code, whose softplus differs from the vectorised one in the last bit; where a loop ends would then depend on
    how many rows are computed together, and `rotate_rows` would not be `rotate`'s rows bit for bit. With rows
    apart, every row is its own loop (single-threaded). Measured on one thread: +12% on this op, forward and
    backward, and no change beyond noise in a model=tiny training step. GPU kernels compute every element alike:
    unchanged there."""
    return F.pad(x, (0, 1))[..., :-1] if x.device.type == "cpu" else x


def polar(x: Tensor, table: Tensor) -> Tensor:
    """x (B, H, T, d) raw q or k, table (…, T, 2, d) from `phase_tables` -> (B, H, T, 2d) in x's dtype: softplus(x)
    (fp32) times the table's cos half, then its sin half."""
    mag = F.softplus(row_by_row(x.float())).unsqueeze(-2)  # (B, H, T, 1, d)
    return (mag * table).flatten(-2).to(x.dtype)  # (B, H, T, 2, d) -> (B, H, T, 2d)


@register
class PoPE(PositionalScheme):
    name = "pope"
    config_cls = PopeConfig
    hooks = ("rotate",)
    paper = "Gopalakrishnan et al. 2025, arXiv:2509.10534"
    relative = True

    def __init__(self, cfg: PopeConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        self.phase_bias = nn.Parameter(torch.zeros(model.n_head, model.head_dim))  # δ (H, d)
        if cfg.bias_init == "uniform":
            with torch.no_grad():
                self.phase_bias.uniform_(PHASE_MIN, 0.0)

    def prepare(self, ctx: PositionContext) -> None:
        inv_freq = pope_inv_freq(self.head_dim, self.cfg.base)  # recomputed per forward: never cast to bf16
        q_tab, k_tab = phase_tables(ctx.positions, inv_freq, clamped_phase_bias(self.phase_bias))
        ctx.tables["pope_q"], ctx.tables["pope_k"] = q_tab, k_tab

    def rotate(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        """q, k (B, H, T, d) -> (B, H, T, 2d) each, Cartesian polar vectors (see the module doc)."""
        return polar(q, ctx.tables["pope_q"]), polar(k, ctx.tables["pope_k"])

    def rotate_rows(self, q: Tensor, k: Tensor, ctx: PositionContext, q_start: int) -> tuple[Tensor, Tensor]:
        """q (B, H, T − q_start, d) the new rows, k (B, H, T, d) every key -> (…, 2d) each, from the same tables."""
        q_tab = ctx.tables["pope_q"][..., q_start:, :, :]  # the query rows' positions
        return polar(q, q_tab), polar(k, ctx.tables["pope_k"])
