"""Command-line knob overrides ("key=value") for the replay tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def knob_values(pairs: Sequence[str]) -> dict[str, Any]:
    """Pairs "key=value": numbers as numbers, anything else as a string."""
    out: dict[str, Any] = {}
    for kv in pairs:
        k, v = kv.split("=", 1)
        try:
            out[k] = float(v) if "." in v or "e" in v else int(v)
        except ValueError:
            out[k] = v
    return out
