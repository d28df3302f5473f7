"""Which filesystem holds a path: the emulator's tree belongs in memory, as sysfs is.

The emulator rewrites its power files every few tens of ms under its lock; on a disk shared
with other I/O one of those writes can stall for ~100 ms, and every emulated step with it.
Nothing fails, the step times just go wrong, so the emulator says so when it starts.
"""

from __future__ import annotations

import os
from pathlib import Path

IN_MEMORY = frozenset({"tmpfs", "ramfs"})


def scratch_dir() -> str:
    """Where to put an emulated tree: /dev/shm when it is writable and has room, as sysfs
    is in memory; /tmp otherwise (the emulator then warns, see Emulator.start)."""
    try:
        st = os.statvfs("/dev/shm")
        if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize > 256 << 20:
            return "/dev/shm"
    except OSError:
        pass
    return "/tmp"


def _unescape(field: str) -> str:
    # /proc/*/mounts writes space, tab, newline and backslash as octal escapes
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def fs_type(path: Path | str, mounts: str | None = None) -> str | None:
    """The type of the filesystem mounted at the deepest mount point holding `path`
    (`mounts`: the text of /proc/self/mounts; read when None). None when unknown."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        # a later mount at the same point hides the earlier one
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    return best_type
