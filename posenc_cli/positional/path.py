"""PaTH: positions as accumulated Householder transforms (Yang et al., NeurIPS 2025, arXiv 2505.16381).

Every token t carries a Householder-like matrix H_t = I − β_t w_t w_tᵀ (per head), built from that layer's input:

    w_t = L2norm(SiLU(shortconv(W_w x_t))),   β_t = 2σ(W_β x_t + b_β) ∈ (0, 2),

and the logit of query i and key j ≤ i is q_iᵀ H_i H_(i−1) ⋯ H_(j+1) k_j / √d: the transforms of the tokens after j
up to and including i; none for j = i, and never H_j itself. Written with the product ascending,
k_jᵀ (H_(j+1) ⋯ H_i) q_i, as in the paper, since every H_t is symmetric.

What the reference code (fla-org/flash-linear-attention at bc3b101, `fla/layers/path_attn.py`, "the layer" below)
fixes, and posenc follows:

- Product order: decoding applies the new token's H_t to every cached key, k_j ← k_j − β_t (k_j·w_t) w_t, and only
  then appends k_t (the layer, lines 148-159), so key j has met H_(j+1), ..., H_i when query i reads it.
- w: one vector per head and channel group of the keys, from a low-rank projection D → 32 → H·hd without biases
  (lines 62-66, `use_low_rank_w=True` at line 39; `pos.w_rank=0` gives the full-rank D → H·hd of lines 69-70),
  then a causal depthwise convolution of kernel 3 over tokens, per channel, without bias, with SiLU (line 81, a
  `ShortConvolution` over kv_dim channels with `conv_size` 3 and `conv_bias` False from lines 41-42 and
  `activation='silu'`; `fla/modules/conv/short_conv.py` lines 52-72: `groups=hidden_size`, left padding kernel
  − 1), then the L2 norm over each head's hd channels
  (line 124), x / √(Σx² + 1e−6) (`fla/modules/l2norm.py` lines 43 and 279).
- β: one per head, 2σ of a linear map with a bias (lines 83 and 111: "allowing negative eigenvalues").
- Scale 1/√hd (`fla/ops/path_attn/parallel.py` lines 265-266, when none is given, as line 125 of the layer does).
- The optional forget gate (`pos.forget_gate`, off as in the layer's `use_forget_gate=False`, line 36): FoX's
  g_t = logσ(W_g x_t + b_g) per head (lines 85-86, 112), logits += Σ_(l=j+1..i) g_l, added *before* the 1/√hd scale
  as the reference kernel does (`fla/ops/path_attn/parallel_path_fwd.py` lines 106-107, `naive.py` lines 94-95).
- Initialisation: every linear and convolution weight N(0, 0.02²), biases 0 (`fla/models/path_attn/
  modeling_path_attention.py` lines 187-197, `initializer_range=0.02` in `configuration_path_attention.py` line
  27); posenc uses `model.init_std` (0.02 by default). So β starts near 1 and H_t near a projection.

How it runs here. `content` returns each token's pre-convolution W_w x_t and its β (and gate) logits, token by
token, so the KV cache keeps them; `logits` does everything that mixes tokens (the convolution, the products) for
one chunk of queries against the keys it sees, exactly. It splits the chunk's keys into blocks of C tokens (up to
`BLOCK` = 64): inside every block at once by matrix products and two unit-triangular solves (the UT transform),
between blocks through the blocks' whole products P_b, d × d matrices (`path_scores`); the plain walk over every
key (one Python step per key) is its reference in tests/positional/test_path.py. The blocks follow token indexes, so
the chunks of one forward (which see prefixes of the same keys) carry each key block once (`PaTH.carried`). O(T² d)
work per layer, T/C Python steps; the measured cost against RoPE's is in docs/commands/schemes.md.
The reference's Triton kernel (`fla.ops.path_attn`) is not used: it fuses the softmax and ·v, so it cannot serve a
hook that returns logits, and it needs CUDA.

Causal only (`causal_only`): a key after its query has no PaTH logit, and the model refuses a non-causal forward.
The hook returns NaN there all the same (the causal mask replaces it, and no gradient flows through it), and refuses
a chunk whose keys reach past its last query.

Packed rows (`PositionContext.documents`): the short convolution reads only its own document's tokens
(`document_taps`), as if the document began the row; the products between key and query cover only the tokens
between them, all in one document when both are (documents are contiguous runs), and the document mask hides the
rest.

Position ids: PaTH ignores them. Its positions are the products over the tokens between query and key, in token
order (the hooks' q_pos, k_pos are token indexes), never the ids, so PaTH is trivially `relative`.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import ConfigError
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme, PositionContext

L2_EPS = 1e-6  # fla/modules/l2norm.py line 279
BLOCK = 64  # most keys per block of `path_scores` (any C gives the same logits up to rounding; for CPU speed: 32, 64
# and 128 came within 15% of each other, in either order, in model=tiny forwards at 2048 and training steps at 128 on
# one shared thread); no more than a chunk's keys need (a power of two)
DECODE_BLOCK = 32  # the same for a chunk of fewer queries (KV-cache decoding): about 2x faster than 128 at 2048 keys


@dataclass(kw_only=True)
class PathConfig(PosConfig):
    name: str = "path"
    w_rank: int = 32  # rank of W_w (the layer's low-rank 32, line 64); 0: full rank
    conv_size: int = 3  # the short convolution's kernel (line 41); 1: no mixing over tokens
    forget_gate: bool = False

    def validate(self) -> None:
        if self.w_rank < 0:
            raise ConfigError(f"pos.w_rank must be >= 0 (0: full rank), got {self.w_rank}")
        if self.conv_size < 1:
            raise ConfigError(f"pos.conv_size must be >= 1, got {self.conv_size}")


# -- the maths, as pure functions ------------------------------------------------------------------------------------


def short_conv(raw: Tensor, weight: Tensor, keep: Tensor | None = None) -> Tensor:
    """Causal depthwise convolution over tokens: raw (B, H, K − 1 + n, d), the K − 1 tokens before the n outputs
    first (zeros before token 0), weight (H, d, K) -> (B, H, n, d), out_t = Σ_m weight[m] · raw[t + m] (PyTorch's
    conv1d with left padding K − 1). keep: (B, 1, n, K) 0/1, the taps each output reads (packed rows: only its own
    document's tokens, `document_taps`); None: all."""
    K = weight.shape[-1]
    n = raw.shape[2] - K + 1
    out = None
    for m in range(K):
        term = raw[:, :, m : m + n] * weight[None, :, None, :, m]  # (B, H, n, d)
        if keep is not None:
            term = term * keep[..., m, None]
        out = term if out is None else out + term
    assert out is not None
    return out


def document_taps(segment: Tensor, lo: int, end: int, K: int) -> Tensor:
    """segment (B, T) document runs (`Documents.segment`), outputs at tokens [lo, end) -> (B, 1, n, K) fp32: 1 where
    tap m of output t reads token t − K + 1 + m of t's own document, 0 where it reads an earlier document (or
    precedes token 0), so the convolution restarts at each document's first token as if it began the row."""
    start = max(lo - K + 1, 0)
    frame = F.pad(segment[:, start:end], (K - 1 - (lo - start), 0), value=-1)  # (B, K − 1 + n)
    n = end - lo
    own = segment[:, lo:end]  # (B, n)
    taps = torch.stack([frame[:, m : m + n] == own for m in range(K)], dim=-1)  # (B, n, K)
    return taps[:, None].float()


def householder_vectors(raw: Tensor, conv: Tensor | None, keep: Tensor | None = None) -> Tensor:
    """raw (B, H, K − 1 + n, d) projections W_w x, conv (H, d, K) or None -> w (B, H, n, d) = L2norm(SiLU(conv(raw)))
    (no convolution and no SiLU without `conv`, as the layer with `use_w_shortconv=False`); keep: the taps of
    `short_conv`."""
    w = raw if conv is None else F.silu(short_conv(raw, conv, keep))
    return w * torch.rsqrt(w.square().sum(-1, keepdim=True) + L2_EPS)


def carry_blocks(k: Tensor, w: Tensor, bw: Tensor) -> tuple[Tensor, Tensor]:
    """Blocks of keys k, w (..., C, d) and D W = bw (..., C, d) -> (k̂, P): every key carried to its block's end,
    k̂_j = H_(C−1) ⋯ H_(j+1) k_j (..., C, d), and the block's whole product P = H_(C−1) ⋯ H_0 (..., d, d)."""
    C, d = k.shape[-2:]
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)  # (C, C) s > r
    lower = torch.eye(C, dtype=k.dtype, device=k.device) + (w @ bw.transpose(-1, -2)).masked_fill(~strict, 0.0)
    rhs = torch.cat([(w @ k.transpose(-1, -2)).masked_fill(~strict, 0.0), w], dim=-1)  # (.., C, C + d)
    solved = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    u, m_w = solved[..., :C], solved[..., C:]  # U (.., C, C), M⁻¹ W (.., C, d)
    return k - u.transpose(-1, -2) @ bw, torch.eye(d, dtype=k.dtype, device=k.device) - bw.transpose(-1, -2) @ m_w


def path_scores(
    q: Tensor,
    k: Tensor,
    w: Tensor,
    beta: Tensor,
    block: int = BLOCK,
    lead: int = 0,
    carried: dict[str, Tensor] | None = None,
) -> Tensor:
    """The plain walk's scores (its reference in tests/positional/test_path.py) by blocks of `block` keys, in matrix
    products. q (B, H, Tq, d), k, w (B, H, n, d), beta (B, H, n) -> (B, H, Tq, n) of the inputs' dtype, equal up to
    rounding where j ≤ i, NaN where j > i (no logit: PaTH is causal).

    The n tokens are padded with identity transforms (β = 0) to nb blocks of C: `lead` of them before (so that
    blocks can follow absolute token indexes), the rest after. Inside a block (local indexes), with G = W Wᵀ,
    D = diag(β), L = the strictly lower part of G and M = I + L D (unit lower triangular), carrying key j through
    H_(j+1), ..., H_t gives k_j − Σ_(s=j+1..t) β_s w_s U_sj with U = M⁻¹ · (W Kᵀ, strictly lower) (each coefficient
    U_sj = w_s·(k_j as H_(s−1) left it) solves a triangular recurrence). So, per block at once:

        J = I:  S = Q Kᵀ − (Q Wᵀ, lower with diagonal) D U                        (scores within the block)
        k̂_j = H_(C−1) ⋯ H_(j+1) k_j:  K̂ = K − Uᵀ D W;   P = H_(C−1) ⋯ H_0 = I − Wᵀ D M⁻¹ W   (`carry_blocks`)
        q̂_i = H_0 ⋯ H_i q_i:  Q̂ = Q − Vᵀ D W,  V = (I + Lᵀ D)⁻¹ · (W Qᵀ, upper with diagonal)

    and for J < I, q_iᵀ H_i ⋯ H_(j+1) k_j = q̂_iᵀ P_(I−1) ⋯ P_(J+1) k̂_j: one batched matmul per block distance
    (nb − 1 steps). The UT transform of DeltaNet-style kernels (as `fla/ops/path_attn/naive.py` uses); derived and
    written here from the recurrence above.

    carried: {"k_hat", "prod"} of the first blocks of these same tokens from an earlier call (a longer prefix of the
    same keys, same `block` and `lead`), reused and extended in place; the caller vouches that the data are the same.
    """
    B, H, n, _ = k.shape
    Tq, C = q.shape[2], block
    nb = -(-(lead + n) // C)
    tail = nb * C - lead - n
    first = lead + n - Tq  # frame index of the first query
    b0 = first // C  # its block
    nq = nb - b0  # query blocks

    def blocks(x: Tensor, front: int) -> Tensor:  # (B, H, N, X) -> (nb', B·H, C, X): block first, so slices of
        x = F.pad(x, (0, 0, front, tail))  # blocks stay contiguous for the batched matmuls
        return x.reshape(B * H, -1, C, x.shape[-1]).transpose(0, 1).contiguous()

    kf, wf = blocks(k, lead), blocks(w, lead)  # (nb, B·H, C, d)
    bw = blocks(beta[..., None], lead) * wf  # D W
    qf = blocks(q, first - b0 * C)  # (nq, B·H, C, d), zero rows before the first query

    need = nb - 1  # every block but the last is a key block of some later query block
    done = 0 if carried is None or "k_hat" not in carried else min(carried["k_hat"].shape[0], need)
    k_hat, prod = carry_blocks(kf[done:need], wf[done:need], bw[done:need])  # (m, B·H, C, d), (m, B·H, d, d)
    if done:
        k_hat = torch.cat([carried["k_hat"][:done], k_hat])  # type: ignore[index]
        prod = torch.cat([carried["prod"][:done], prod])  # type: ignore[index]
    if carried is not None and need > done:
        carried.update(k_hat=k_hat, prod=prod)

    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)  # (C, C) s > r
    kq, wq, bwq = kf[b0:], wf[b0:], bw[b0:]
    gram = wq @ bwq.transpose(-1, -2)  # (nq, B·H, C, C): G D, (s, r) -> w_s·w_r β_r
    lower = eye + gram.masked_fill(~strict, 0.0)  # M = I + L D
    a_q = (wq @ kq.transpose(-1, -2)).masked_fill(~strict, 0.0)  # (s, j) -> w_s·k_j for s > j
    u = torch.linalg.solve_triangular(lower, a_q, upper=False, unitriangular=True)  # U
    intra = qf @ kq.transpose(-1, -2) - (qf @ bwq.transpose(-1, -2)).tril() @ u  # (nq, B·H, C, C)
    intra = intra.masked_fill(strict.T, float("nan"))  # j > i: no logit
    upper = eye + gram.masked_fill(~strict.T, 0.0)  # I + Lᵀ D (G is symmetric)
    b_q = (wq @ qf.transpose(-1, -2)).triu()  # (s, i) -> w_s·q_i for s <= i
    v = torch.linalg.solve_triangular(upper, b_q, upper=True, unitriangular=True)
    q_hat = qf - v.transpose(-1, -2) @ bwq  # (nq, B·H, C, d)

    out = q.new_full((B * H, nq, C, nb, C), float("nan"))  # blocks after a query block stay NaN
    out.diagonal(b0, dim1=1, dim2=3).copy_(intra.permute(1, 2, 3, 0))  # blocks (a, b0 + a)
    r, a0 = q_hat, 0  # r: the query blocks a >= a0 still to score, carried through the blocks between
    for delta in range(1, nb):
        a_min = max(0, delta - b0)  # query blocks with a key block delta before them
        if a_min >= nq:
            break
        r, a0 = r[a_min - a0 :], a_min
        keys = slice(b0 + a_min - delta, b0 + nq - delta)  # their key blocks J = b0 + a − delta
        scores = r @ k_hat[keys].transpose(-1, -2)  # (m, B·H, C, C)
        out.diagonal(b0 - delta, dim1=1, dim2=3).copy_(scores.permute(1, 2, 3, 0))
        r = r @ prod[keys]  # past block J on the way to J − 1
    out = out.view(B, H, nq * C, nb * C)
    rows = first - b0 * C
    return out[:, :, rows : rows + Tq, lead : lead + n]


def gate_sums(log_f: Tensor, n_q: int) -> Tensor:
    """log_f (B, H, n) log forget gates of the chunk's n tokens -> (B, H, n_q, n) Σ_(l=j+1..i) log f_l for the last
    n_q tokens i (a cumulative-sum difference c_i − c_j; j > i entries are masked later)."""
    c = log_f.cumsum(-1)  # (B, H, n)
    return c[:, :, -n_q:, None] - c[:, :, None, :]


# -- the scheme ------------------------------------------------------------------------------------------------------


@register
class PaTH(PositionalScheme):
    name = "path"
    config_cls = PathConfig
    hooks = ("content", "logits")
    paper = "Yang et al. 2025, arXiv:2505.16381"
    relative = True  # ids are ignored (see the module docstring)
    causal_only = True  # no logit for a key after its query (the hook gives NaN there)

    def __init__(self, cfg: PathConfig, model: ModelConfig, train_length: int) -> None:
        super().__init__(cfg, model, train_length)
        L, H, D, hd = model.n_layer, model.n_head, model.d_model, model.head_dim
        std = model.init_std  # fla: every Linear and Conv1d weight N(0, initializer_range = 0.02)
        self.conv_size = cfg.conv_size
        self.forget_gate = cfg.forget_gate
        self.low_rank = cfg.w_rank > 0
        if self.low_rank:
            self.w_down = nn.Parameter(torch.randn(L, cfg.w_rank, D) * std)  # (L, r, D)
            self.w_up = nn.Parameter(torch.randn(L, H * hd, cfg.w_rank) * std)  # (L, H·hd, r)
        else:
            self.w_proj = nn.Parameter(torch.randn(L, H * hd, D) * std)  # (L, H·hd, D)
        # conv_size 1 is no convolution at all (the layer's use_w_shortconv=False: no SiLU either)
        self.conv = nn.Parameter(torch.randn(L, H, hd, cfg.conv_size) * std) if cfg.conv_size > 1 else None
        self.beta_proj = nn.Parameter(torch.randn(L, H, D) * std)  # (L, H, D)
        self.beta_bias = nn.Parameter(torch.zeros(L, H))
        if cfg.forget_gate:
            self.gate_proj = nn.Parameter(torch.randn(L, H, D) * std)
            self.gate_bias = nn.Parameter(torch.zeros(L, H))

    def content(self, layer: int, x: Tensor, ctx: PositionContext) -> Tensor:
        """x (B, T, D) -> (B, H, T, hd + 1 [+ 1]) fp32: W_w x_t (before the convolution), the β logit [, the gate
        logit], each from x_t alone."""
        B, T, _ = x.shape
        with torch.autocast(x.device.type, enabled=False):
            x = x.float()
            if self.low_rank:
                raw = F.linear(F.linear(x, self.w_down[layer]), self.w_up[layer])  # (B, T, H·hd)
            else:
                raw = F.linear(x, self.w_proj[layer])
            raw = raw.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
            feats = [raw, F.linear(x, self.beta_proj[layer], self.beta_bias[layer]).transpose(1, 2)[..., None]]
            if self.forget_gate:
                feats.append(F.linear(x, self.gate_proj[layer], self.gate_bias[layer]).transpose(1, 2)[..., None])
            return torch.cat(feats, dim=-1)

    def logits(self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, ctx: PositionContext) -> Tensor:
        """The chunk's queries q (B, H, Tq, hd) at token indexes q_pos (contiguous) against its keys k (B, H, Tk, hd)
        at k_pos = [lo, end), the queries last -> (B, H, Tq, Tk) fp32 (q_iᵀ H_i ⋯ H_(j+1) k_j [+ gates]) / √hd,
        NaN where j > i."""
        lo, end = int(k_pos[0]), int(k_pos[-1]) + 1
        if int(q_pos[-1]) + 1 != end:
            raise ValueError("PaTH attention is causal: its logits are defined for keys up to the query only")
        feats = ctx.content[layer]  # (B, H, T, F) all tokens
        hd, K = self.head_dim, self.conv_size
        with torch.autocast(q.device.type, enabled=False):
            start = max(lo - K + 1, 0)
            raw = F.pad(feats[:, :, start:end, :hd], (0, 0, K - 1 - (lo - start), 0))  # (B, H, K − 1 + Tk, hd)
            conv = None if self.conv is None else self.conv[layer].float()
            docs = ctx.documents  # packed rows: the convolution restarts at each document's first token
            keep = None if docs is None or conv is None else document_taps(docs.segment, lo, end, K)
            w = householder_vectors(raw, conv, keep)  # (B, H, Tk, hd)
            beta = 2 * torch.sigmoid(feats[:, :, lo:end, hd])  # (B, H, Tk)
            scale = 1.0 / math.sqrt(hd)
            block = min(DECODE_BLOCK if q.shape[2] < DECODE_BLOCK else BLOCK, 1 << max(3, (end - lo - 1).bit_length()))
            carried = self.carried(layer, k, ctx, block) if lo == 0 else None
            scores = path_scores(q.float() * scale, k.float(), w, beta, block, carried=carried)  # (B, H, Tq, Tk)
            if self.forget_gate:
                scores = scores + gate_sums(F.logsigmoid(feats[:, :, lo:end, hd + 1]), q.shape[2]) * scale
            return scores  # NaN where j > i (`path_scores`)

    def carried(self, layer: int, k: Tensor, ctx: PositionContext, block: int) -> dict[str, Tensor]:
        """The carried keys and block products of layer `layer`'s earlier chunks in this forward (`path_scores`'s
        `carried`), kept in `ctx.tables`: chunks of one forward see prefixes [0, end) of the same keys, so each block
        is carried once instead of once per chunk. A new entry whenever the layer, the keys (the tensor they are a
        view of, held weakly, its offset and version), the layer's content features or the block size differ, so
        only the current layer's blocks are kept."""
        base = k if k._base is None else k._base
        # inference tensors (torch.inference_mode, as evaluation runs) keep no version counter; they cannot be changed
        # in place outside inference mode, and a forward never changes its keys in place, so identity must do there
        version = -1 if base.is_inference() else base._version
        stamp = (layer, block, k.storage_offset(), k.stride(), k.dtype, version)
        entry = ctx.tables.get("path_carried")
        if (
            entry is None
            or entry["base"]() is not base
            or entry["feats"] is not ctx.content[layer]
            or entry["stamp"] != stamp
        ):
            entry = {"base": weakref.ref(base), "feats": ctx.content[layer], "stamp": stamp, "data": {}}
            ctx.tables["path_carried"] = entry
        return entry["data"]
