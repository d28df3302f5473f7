"""One writer of the board at a time: the daemon holds an exclusive flock on
`<state_dir>/powerd.lock` for as long as it runs, and `powerd restore` takes the same lock
before it writes anything. The kernel drops a flock when its holder dies (kill -9
included), so a stale file never blocks anyone; the pid inside is only for messages."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "powerd.lock"


class BoardLock:
    def __init__(self, state_dir: Path | str):
        self.path = Path(state_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout_s: float = 0.0) -> bool:
        """Take the lock, waiting up to `timeout_s`. False if another process holds it.
        Raises OSError when the lock file cannot be opened at all."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def holder(self) -> int | None:
        """The pid written by the holder (for messages); None if unknown."""
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
