"""The attention layer: fused QKV projection, the scheme's hooks on q and k, the forward's kernel, output projection."""

from __future__ import annotations

from torch import Tensor, nn

from posenc_cli.attention.choose import attend
from posenc_cli.attention.state import AttentionState
from posenc_cli.config import ModelConfig
from posenc_cli.kv_cache import KVCache
from posenc_cli.options import LayerOptions
from posenc_cli.positional.base import PositionalScheme, PositionContext
from posenc_cli.positional.span import FULL, Span
from posenc_cli.temperatures import Temperature, from_model


class CausalSelfAttention(nn.Module):
    """Fused QKV projection, scheme hooks on q/k, the chosen attention kernel, output projection (`proj` is a
    residual projection).

    `chunk_size`: queries per chunk on the roads that score by query chunks (`KernelSpec.chunk_size`; it also turns
    off the roads that take no chunks: the key-bias, FlexAttention and block-causal ones); None, the default: the
    kernel choice sizes chunks from `BIAS_CHUNK_BYTES`."""

    def __init__(self, cfg: ModelConfig, layer: int, chunk_size: int | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.n_head = cfg.n_head
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.chunk_size = chunk_size
        # the temperature `model.attn_scale` names (None: none), with its per-head parameter if it learns one, kept
        # under the entry's name (`blocks.<i>.attn.ssmax_scale`, `blocks.<i>.attn.head_scale`)
        self.temperature = from_model(cfg)
        if self.temperature is not None and self.temperature.parameter is not None:
            init = self.temperature.init_parameter(cfg.n_head)
            self.register_parameter(self.temperature.parameter, nn.Parameter(init))

    def tempered(self, q: Tensor, temperature: Temperature, state: AttentionState, q_start: int = 0) -> Tensor:
        """q (B, H, T − q_start, hd), the query rows [q_start, T), times `temperature`'s factors for those rows
        (its table's rows from `state`, its parameter from this layer)."""
        param = getattr(self, temperature.parameter) if temperature.parameter is not None else None
        return temperature.apply(q, state.temperature_rows(temperature, q_start), param)

    def length_scale(self, q: Tensor, state: AttentionState, q_start: int = 0) -> Tensor:
        """q (B, H, T − q_start, hd), the query rows [q_start, T), times each query's factor under
        `model.attn_scale` (q itself for `none`)."""
        return q if self.temperature is None else self.tempered(q, self.temperature, state, q_start)

    def qkv_heads(
        self,
        x: Tensor,
        scheme: PositionalScheme,
        ctx: PositionContext,
        cache: KVCache | None = None,
        state: AttentionState | None = None,
        temperature: Temperature | None = None,
        options: LayerOptions | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) -> q, k, v (B, H, T, hd), with q and k already rotated by the scheme (and q length-scaled,
        then multiplied by the layer's `temperature` if it has one). `options`: the block's model options, whose
        `heads` hook sees the new heads before the cache and the rotation, and `rotated` hook q and k after it.

        With a cache, x holds the Tq new tokens: their unrotated k, v join the cache, and k, v are returned for all
        Tc + Tq tokens, q for the Tq new ones (B, H, Tq, hd), rotated at their positions (`rotate_rows`).
        `state`: the forward's attention state (its length-scale tables are reused); None: built for this call.
        """
        state = AttentionState(scheme, ctx) if state is None else state
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)  # 3 × (B, T, D)
        q = q.view(B, T, self.n_head, self.head_dim)  # (B, T, H, hd)
        k = k.view(B, T, self.n_head, self.head_dim)  # (B, T, H, hd)
        v = v.view(B, T, self.n_head, self.head_dim)  # (B, T, H, hd)
        if options:
            q, k, v = options.heads(q, k, v, ctx, cache)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd) each
        q_start = 0
        if cache is not None:
            k, v = cache.append(self.layer, k, v)  # (B, H, Tc + T, hd), unrotated keys
            q_start = k.shape[2] - T  # the new tokens' rows of the context
        if "content" in scheme.hooks:  # per-token features of this layer's input, for the scheme's later hooks
            features = scheme.content(self.layer, x, ctx)
            if features is not None:
                ctx.content[self.layer] = features if cache is None else cache.append_content(self.layer, features)
        if cache is not None and scheme.fixed_key_rotation:  # keys rotated at earlier forwards are kept
            q, k = cache.rotated_keys(self.layer, scheme, q, k, ctx, q_start)
        else:
            q, k = scheme.rotate_rows(q, k, ctx, q_start) if q_start else scheme.rotate(q, k, ctx)
        if options:
            q, k = options.rotated(q, k)
        q = self.length_scale(q, state, q_start)
        if temperature is not None:  # the layer's own, from its LayerView (e.g. Llama 4's floor-log)
            q = self.tempered(q, temperature, state, q_start)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        scheme: PositionalScheme,
        ctx: PositionContext,
        causal: bool = True,
        cache: KVCache | None = None,
        state: AttentionState | None = None,
        span: Span = FULL,
        temperature: Temperature | None = None,
        options: LayerOptions | None = None,
    ) -> Tensor:
        """x (B, T, D) -> (B, T, D). `state`: the forward's `AttentionState` (`GPT.forward` passes one to every
        layer, so tables and the kernel choice are shared); None: a fresh one for this call. `span` and
        `temperature`: the layer's, from its `LayerView` (full span, none by default). `options`: the block's model
        options (`posenc_cli.options`; their hooks on the heads, the softmax's sinks, the output)."""
        if state is None:
            state = AttentionState(scheme, ctx)
        elif state.scheme is not scheme or state.ctx is not ctx:
            raise ValueError("the attention state belongs to another scheme or forward")
        B, T, D = x.shape
        q, k, v = self.qkv_heads(x, scheme, ctx, cache, state, temperature, options)
        y = attend(
            q,
            k,
            v,
            scheme,
            self.layer,
            ctx,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            chunk_size=self.chunk_size,
            q_start=k.shape[2] - T,
            state=state,
            span=span,
            sinks=options.sink_logits() if options else None,
        )  # (B, H, T, hd)
        y = y.transpose(1, 2)  # (B, T, H, hd)
        if options:
            y = options.output(y, x)
        return self.resid_drop(self.proj(y.reshape(B, T, D)))  # (B, T, D)
