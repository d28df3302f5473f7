"""systemd notifications (READY, STATUS, WATCHDOG, STOPPING); harmless without systemd."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("powerd.notify")


class SystemdNotifier:
    def __init__(self) -> None:
        self._n = None
        if os.environ.get("NOTIFY_SOCKET"):
            try:
                import sdnotify

                self._n = sdnotify.SystemdNotifier()
            except ImportError:  # pragma: no cover - sdnotify is a dependency
                log.warning("NOTIFY_SOCKET is set but sdnotify is not installed")
        usec = os.environ.get("WATCHDOG_USEC", "")
        # ping at half the interval systemd expects
        self._period = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None
        self._last_ping = 0.0

    def _send(self, state: str) -> None:
        if self._n is not None:
            self._n.notify(state)

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def watchdog(self) -> None:
        if self._period is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self._period:
            self._last_ping = now
            self._send("WATCHDOG=1")
