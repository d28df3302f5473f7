"""Exceptions of the device layer. Every one names the file or state it is about."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from powerd.modes import PowerMode


class DeviceError(Exception):
    """The hardware (or the file tree standing in for it) cannot be used as asked."""


class SysfsReadError(DeviceError):
    """A sysfs/debugfs/proc file could not be read or parsed."""

    def __init__(self, path: Path | str, reason: str, errno: int | None = None):
        self.path = Path(path)
        self.reason = reason
        self.errno = errno
        super().__init__(f"cannot read {self.path}: {reason}")


class SysfsWriteError(DeviceError):
    """The kernel refused a write (EINVAL, EACCES, EBUSY, ...) or the file is missing."""

    def __init__(
        self, path: Path | str, value: str, errno: int | None, strerror: str | None = None
    ):
        self.path = Path(path)
        self.value = value
        self.errno = errno
        self.strerror = strerror or (os.strerror(errno) if errno else "write failed")
        super().__init__(f"writing {value!r} to {self.path} failed: {self.strerror}")


class SwitchError(DeviceError):
    """A power-mode switch did not take effect.

    `problems` lists each mismatch or refused write (with its file); `left_in` says which
    known state the controller put the board back into: "previous" (the last verified
    mode, `left_mode`), "baseline" (the saved admin state) or "unknown" (recovery failed
    too: `problems` then also holds the recovery's own failures).
    """

    def __init__(
        self,
        mode: PowerMode,
        problems: list[str],
        left_in: str,
        left_mode: PowerMode | None = None,
    ):
        self.mode = mode
        self.problems = list(problems)
        self.left_in = left_in
        self.left_mode = left_mode
        if left_in == "previous":
            where = f"board left in the previous mode {left_mode}"
        elif left_in == "baseline":
            where = "board restored to the baseline"
        else:
            where = "board state UNKNOWN (recovery failed)"
        detail = "; ".join(self.problems)
        super().__init__(f"switch to {mode} failed: {detail}; {where}")
