"""The only primitives that touch sysfs/debugfs/procfs files, all resolved under one root.

Reads strip the trailing newline and the NUL terminators device-tree strings carry. A
write is one `write(2)` on an `O_WRONLY|O_TRUNC` descriptor: sysfs ignores the
truncation, while the plain files of an emulated tree need it, and a single syscall is
what the kernel (or an inotify-driven emulator) sees as one write.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from powerd.device.errors import DeviceError, SysfsReadError, SysfsWriteError

__all__ = [
    "DeviceError",
    "DeviceRoot",
    "SysfsReadError",
    "SysfsWriteError",
    "format_cpu_list",
    "parse_cpu_list",
    "read_int",
    "read_int_list",
    "read_text",
    "write_value",
]


@dataclass(frozen=True)
class DeviceRoot:
    """Maps the absolute paths of JETSON.md onto a root directory ("/" in production)."""

    root: Path

    def __init__(self, root: Path | str):
        object.__setattr__(self, "root", Path(root).absolute())

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def rel(self, path: Path) -> str:
        """`path` as the absolute path it stands for on a real board (for messages and files)."""
        try:
            return "/" + str(path.relative_to(self.root))
        except ValueError:
            return str(path)


def read_text(path: Path | str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise SysfsReadError(path, exc.strerror or str(exc), exc.errno) from None
    return raw.decode("utf-8", errors="replace").replace("\x00", " ").strip()


def read_int(path: Path | str) -> int:
    text = read_text(path)
    try:
        return int(text)
    except ValueError:
        raise SysfsReadError(path, f"expected an integer, got {text!r}") from None


def read_int_list(path: Path | str) -> list[int]:
    """A space-separated list of integers (available frequencies, related_cpus)."""
    text = read_text(path)
    try:
        return [int(tok) for tok in text.split()]
    except ValueError:
        raise SysfsReadError(path, f"expected integers, got {text!r}") from None


def write_value(path: Path | str, value: int | str) -> None:
    data = f"{value}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as exc:
        raise SysfsWriteError(path, str(value), exc.errno, exc.strerror) from None
    try:
        # sysfs reports EINVAL/EBUSY from write() itself, so one write call must carry it all.
        written = os.write(fd, data)
    except OSError as exc:
        raise SysfsWriteError(path, str(value), exc.errno, exc.strerror) from None
    finally:
        try:
            os.close(fd)
        except OSError:  # pragma: no cover - sysfs reports errors on write(), not close()
            pass
    if written != len(data):
        raise SysfsWriteError(path, str(value), None, f"short write ({written} bytes)")


def parse_cpu_list(text: str) -> list[int]:
    """Kernel CPU range list ("0-3,8", "" when none) -> sorted CPU ids."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                cpus.update(range(int(lo), int(hi) + 1))
            else:
                cpus.add(int(part))
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}") from None
    return sorted(cpus)


def format_cpu_list(cpus: list[int] | set[int] | tuple[int, ...]) -> str:
    """Sorted CPU ids -> kernel range list ("0-3,8")."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)
