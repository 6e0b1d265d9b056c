"""NoPE: no positional information; order enters only through the causal mask (Kazemnejad et al. 2023).

Position ids are ignored, so NoPE is trivially `relative`.
"""

from __future__ import annotations

from dataclasses import dataclass

from posenc_cli.config import PosConfig
from posenc_cli.positional import register
from posenc_cli.positional.base import PositionalScheme


@dataclass(kw_only=True)
class NopeConfig(PosConfig):
    name: str = "nope"


@register
class NoPE(PositionalScheme):
    name = "nope"
    config_cls = NopeConfig
    hooks = ()
    paper = "Kazemnejad et al. 2023, arXiv:2305.19466"
    relative = True  # ignores the ids
