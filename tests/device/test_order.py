import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerd.device.order import limit_writes

freq = st.integers(1, 50)


def _window(a: int, b: int) -> tuple[int, int]:
    return (min(a, b), max(a, b))


@given(freq, freq, freq, freq)
def test_every_intermediate_window_is_valid_and_the_target_is_reached(a, b, c, d) -> None:
    cur_min, cur_max = _window(a, b)
    new_min, new_max = _window(c, d)
    lo, hi = cur_min, cur_max
    for which, value in limit_writes(cur_min, cur_max, new_min, new_max):
        if which == "min":
            lo = value
        else:
            hi = value
        assert lo <= hi, "a kernel that refuses min > max would reject this write"
    assert (lo, hi) == (new_min, new_max)


def test_raising_writes_max_first_and_lowering_writes_min_first() -> None:
    assert limit_writes(100, 100, 500, 500) == [("max", 500), ("min", 500)]
    assert limit_writes(500, 500, 100, 100) == [("min", 100), ("max", 100)]


def test_invalid_target_is_refused() -> None:
    with pytest.raises(ValueError):
        limit_writes(1, 2, 5, 4)
