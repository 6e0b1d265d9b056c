"""Per-query attention temperatures a layout gives a layer: `FloorLog`, Llama 4's floor-log temperature, an entry of
the temperature registry (`posenc_cli.temperatures.floor_log`), re-exported for the positional package's users."""

from __future__ import annotations

from posenc_cli.temperatures.floor_log import FloorLog

__all__ = ["FloorLog"]
