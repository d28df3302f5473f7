"""The one rule for moving a [min, max] frequency window without an invalid step.

Older kernels reject min > max with EINVAL (newer ones clamp silently), so the window
must be valid after every single write. Raising: the max first, then the min.
Lowering (or any move where the new min fits under the current max): the min first,
then the max. Used by the controller and by baseline restore alike.
"""

from __future__ import annotations

from typing import Literal

Limit = Literal["min", "max"]


def limit_writes(cur_min: int, cur_max: int, new_min: int, new_max: int) -> list[tuple[Limit, int]]:
    """The writes that move [cur_min, cur_max] to [new_min, new_max], each leaving min <= max.

    If new_min > cur_max, writing the min first would put min above the current max; the
    max goes first (new_max >= new_min > cur_max >= cur_min keeps it valid). Otherwise the
    min goes first (new_min <= cur_max), and then the max (new_max >= new_min).
    """
    if new_min > new_max:
        raise ValueError(f"invalid target window [{new_min}, {new_max}]")
    if new_min > cur_max:
        return [("max", new_max), ("min", new_min)]
    return [("min", new_min), ("max", new_max)]
