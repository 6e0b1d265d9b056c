"""Attention-logit length scaling (`model.attn_scale`): the factor tables now live in the temperature registry
(`posenc_cli.temperatures`); re-exported here for the code and tests that import them from `attention`."""

from __future__ import annotations

from posenc_cli.temperatures.logn import logn_factor
from posenc_cli.temperatures.ssmax import ssmax_factor

__all__ = ["logn_factor", "ssmax_factor"]
