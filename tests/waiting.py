"""Polling helpers the tests share: the daemon, the emulator and clients all react
asynchronously, so tests wait for a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    pred: Callable[[], Any], timeout_s: float, what: str, board: Any = None, period_s: float = 0.02
) -> None:
    """Return once `pred()` is true; fail naming `what` (and the daemon's log tail, given an
    EmulatedBoard) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(period_s)
    tail = "" if board is None else "\n" + board.log_tail()
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{tail}")


def poll_until(cond: Callable[[], Any], timeout_s: float = 2.0, period_s: float = 0.005) -> bool:
    """Whether `cond()` became true within `timeout_s` (for tests that assert on it)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(period_s)
    return True


def first_true(pred: Callable[[], Any], timeout_s: float, period_s: float = 0.1) -> Any:
    """`pred()`'s first true value within `timeout_s`, else None (for tests that use it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(period_s)
    return None
