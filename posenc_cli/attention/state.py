"""What the attention layers of one forward share: the scheme, its position context, and what is built once.

`GPT.forward` makes one `AttentionState` per forward and hands it to every layer. It replaces the string keys the
attention code used to keep in `PositionContext.tables` (which stays the schemes' own): every cached tensor is a
typed field, filled the first time a layer asks for it, and the kernels chosen for this forward are kept beside
them (`kernel`), so the choice (`posenc_cli.attention.choose.choose_kernel`) runs once per distinct `KernelSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from posenc_cli.attention.scale import logn_factor, ssmax_factor
from posenc_cli.positional.base import PositionalScheme, PositionContext, per_head

if TYPE_CHECKING:  # the kernels and their choice import this module
    from posenc_cli.attention.choose import KernelSpec
    from posenc_cli.attention.kernels import Kernel

MaskKey = tuple[torch.dtype, bool, int]  # (dtype, causal, T) of a folded bias + causal mask


@dataclass(eq=False)
class AttentionState:
    """Per-forward attention state: `scheme` and `ctx` as the layers receive them, and lazily built tables.

    masks: a bias shared by every layer (`bias_shared_across_layers`) folded with the causal mask, per
        (dtype, causal, T). The other tables are built by their accessors, once per forward.
    """

    scheme: PositionalScheme
    ctx: PositionContext
    masks: dict[MaskKey, Tensor] = field(default_factory=dict)
    _key_bias: Tensor | None = None
    _key_bias_done: bool = False
    _min_id: int | None = None
    _logn: Tensor | None = None
    _ssmax: Tensor | None = None
    _kernels: dict[KernelSpec, Kernel] = field(default_factory=dict)

    def kernel(self, spec: KernelSpec) -> Kernel:
        """The kernel for `spec`, chosen on the first request of this forward and reused by every later layer."""
        if spec not in self._kernels:
            from posenc_cli.attention.choose import choose_kernel  # choose imports this module

            self._kernels[spec] = choose_kernel(spec)
        return self._kernels[spec]

    def key_bias(self) -> Tensor:
        """The scheme's `key_bias` (H, T) or (B, H, T) at this forward's token indexes, computed once (all layers
        share it). Only asked for when the scheme `offers_key_bias`."""
        if not self._key_bias_done:
            self._key_bias = self.scheme.key_bias(self.ctx.token_index, self.ctx)
            self._key_bias_done = True
        if self._key_bias is None:
            raise ValueError(f"scheme '{self.scheme.name}' offers key_bias but its key_bias hook returned None")
        return self._key_bias

    def min_id(self) -> int:
        """The smallest position id (one host sync per forward, shared by the layers)."""
        if self._min_id is None:
            self._min_id = int(self.ctx.positions.min())
        return self._min_id

    def logn(self, length: int) -> Tensor:
        """Qwen's log-n factor per query (`logn_factor`), broadcastable against (B, H, T, 1): (T, 1) or
        (B, 1, T, 1) fp32; built once per forward (every layer has the same `length`)."""
        if self._logn is None:
            self._logn = per_head(logn_factor(self.ctx.positions, length)[..., None])  # (T, 1) or (B, 1, T, 1)
        return self._logn

    def ssmax(self) -> Tensor:
        """SSMax's log n per query (`ssmax_factor`), (T,) fp32 on the positions' device; built once per forward."""
        if self._ssmax is None:
            self._ssmax = ssmax_factor(self.ctx.token_index).to(self.ctx.positions.device)  # (T,)
        return self._ssmax
