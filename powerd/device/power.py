"""Board power from the INA3221 monitors (hwmon), and a background sampler.

Rails are found by globbing, never by fixed hwmonN paths: the index changes between boots.
A rail named VDD_IN or POM_5V_IN is the board input, i.e. the total; otherwise the total is
the sum of the rails (Orin AGX "module power", as the published measurements report it).
"""

from __future__ import annotations

import bisect
import collections
import logging
import math
import random
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from powerd.device import sysfs
from powerd.device.boards import TOTAL_RAIL_NAMES
from powerd.device.errors import DeviceError, SysfsReadError

log = logging.getLogger(__name__)

I2C_DEVICES = "/sys/bus/i2c/devices"
_LABEL_RE = re.compile(r"in(\d+)_label$")


@dataclass(frozen=True)
class Rail:
    name: str
    device: str  # i2c device, e.g. "1-0040"
    channel: int
    voltage_path: Path  # inK_input, mV
    current_path: Path  # currK_input, mA

    def read_mw(self) -> float:
        return sysfs.read_int(self.voltage_path) * sysfs.read_int(self.current_path) / 1000.0


def _is_unconnected(label: str) -> bool:
    # "NC" as a whole token ("NC", "NC_1", "in2 NC"), not a substring of a real name.
    return "NC" in re.split(r"[^A-Za-z0-9]+", label.upper())


def _is_shunt_sum(label: str) -> bool:
    return "sum of shunt" in label.lower()


def discover_rails(root: Path | str) -> list[Rail]:
    """Every connected INA3221 channel under root."""
    dev = sysfs.DeviceRoot(root)
    rails: list[Rail] = []
    for name_file in sorted(dev.path(I2C_DEVICES).glob("*/name")):
        try:
            if "ina3221" not in sysfs.read_text(name_file).lower():
                continue
        except SysfsReadError:
            continue
        device = name_file.parent
        for hwmon in sorted(device.glob("hwmon/hwmon*")):
            for label_file in sorted(hwmon.glob("in*_label")):
                m = _LABEL_RE.match(label_file.name)
                if not m:
                    continue
                k = int(m.group(1))
                try:
                    label = sysfs.read_text(label_file)
                except SysfsReadError:
                    continue
                if not label or _is_unconnected(label) or _is_shunt_sum(label):
                    continue
                volt, curr = hwmon / f"in{k}_input", hwmon / f"curr{k}_input"
                if not (volt.is_file() and curr.is_file()):
                    continue  # a disabled channel, or one that measures no current
                rails.append(Rail(label, device.name, k, volt, curr))
    return rails


def read_update_interval_s(hwmon_dirs: Sequence[Path]) -> float | None:
    """The slowest of the chips' conversion cycles (hwmon `update_interval`, ms: channels x
    samples averaged x conversion times); None where no chip says (an older kernel)."""
    found: list[float] = []
    for d in hwmon_dirs:
        try:
            ms = sysfs.read_int(d / "update_interval")
        except (SysfsReadError, ValueError):
            continue
        if ms > 0:
            found.append(ms / 1000.0)
    return max(found) if found else None


class PowerReader:
    """Reads board power (W) and per-rail power from the INA3221s under `root`."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._discover()

    @property
    def lag_s(self) -> float | None:
        """How long after a load step every reading shows only the new load: a read returns
        the last finished conversion, which averaged up to one cycle before it finished."""
        ui = self.update_interval_s
        return None if ui is None else 2.0 * ui

    def _discover(self) -> None:
        rails = discover_rails(self.root)
        if not rails:
            raise DeviceError(
                f"no INA3221 power rails under {self.root / I2C_DEVICES.lstrip('/')}"
                "/*/hwmon/hwmon*/ (is the ina3221 driver loaded?)"
            )
        self.rails = rails
        self.total_rail: Rail | None = next((r for r in rails if r.name in TOTAL_RAIL_NAMES), None)
        # how often the chips behind the total refresh their readings (None: unknown); read
        # here, not per use: the request path asks for it on every inference batch
        used = [self.total_rail] if self.total_rail is not None else rails
        self.update_interval_s = read_update_interval_s(
            sorted({r.voltage_path.parent for r in used})
        )

    def read_rails(self) -> dict[str, float]:
        """Watts per rail (the total rail, if any, included under its own name)."""
        return {r.name: r.read_mw() / 1000.0 for r in self.rails}

    def read_w(self) -> float:
        """Board power in watts. A vanished hwmon dir (driver rebound) is looked up again once."""
        try:
            return self._read_total()
        except SysfsReadError:
            self._discover()
            return self._read_total()

    def _read_total(self) -> float:
        if self.total_rail is not None:
            return self.total_rail.read_mw() / 1000.0
        return sum(r.read_mw() for r in self.rails) / 1000.0


class WattReader(Protocol):
    def read_w(self) -> float: ...


SAMPLE_DITHER = 0.5  # each sampling interval is (1 +- this) x the configured one
MAX_REQUESTS = 64  # extra readings asked for (sample_at) and not taken yet


class PowerSampler:
    """Samples `reader.read_w()` every `interval_s` on a background thread into a ring buffer
    of (time.monotonic(), watts). A failed read is logged and counted; the thread goes on."""

    def __init__(self, reader: WattReader, interval_s: float = 0.1, capacity: int | None = None):
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.reader = reader
        self.interval_s = interval_s
        # Default: ten minutes of samples, far longer than any measuring window.
        cap = capacity if capacity is not None else max(16, int(600 / interval_s))
        self._buf: collections.deque[tuple[float, float]] = collections.deque(maxlen=cap)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._requests: list[float] = []  # sorted times of extra readings (sample_at)
        self._last_request = -math.inf
        # extra readings closer together than this are one: a burst of short batches must
        # not turn the sampler into a busy loop over the rails' files
        self.min_request_gap_s = interval_s / 4.0
        self._thread: threading.Thread | None = None
        self.errors = 0
        self.last_error: str | None = None
        self.requested = 0  # extra readings taken
        # (level W, event): a reading above the level sets the event (see watch)
        self._watch: tuple[float, threading.Event] | None = None

    def start(self) -> PowerSampler:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="powerd-power", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 5 * self.interval_s))
            self._thread = None

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def sample_once(self) -> None:
        try:
            watts = self.reader.read_w()
        except Exception as exc:  # any reader failure must not end sampling
            self.errors += 1
            self.last_error = str(exc)
            # First failure loudly, then quietly: a flapping sensor must not flood the journal.
            level = logging.WARNING if self.errors == 1 or self.errors % 100 == 0 else logging.DEBUG
            log.log(level, "power read failed (%d so far): %s", self.errors, exc)
            return
        with self._lock:
            self._buf.append((time.monotonic(), watts))
        watch = self._watch
        if watch is not None and watts > watch[0]:
            watch[1].set()

    def watch(self, level_w: float | None, event: threading.Event | None = None) -> None:
        """Set `event` on every reading above `level_w` (None: stop watching). The control
        loop sleeps between ticks; a probe far over the budget is stopped on the reading
        that shows it, not up to a loop period later."""
        self._watch = None if level_w is None or event is None else (level_w, event)

    @property
    def watched_w(self) -> float | None:
        """The level being watched (None: none)."""
        watch = self._watch
        return None if watch is None else watch[0]

    def sample_at(self, t: float) -> bool:
        """Take one more reading at time.monotonic() `t`, besides the regular ones (a short
        inference batch the regular grid would miss). Cheap, callable from any thread.
        False when one is already due within `min_request_gap_s` of it, or too many wait."""
        with self._lock:
            if abs(t - self._last_request) < self.min_request_gap_s:
                return False
            if len(self._requests) >= MAX_REQUESTS:
                return False
            self._last_request = t
            bisect.insort(self._requests, t)
        self._wake.set()
        return True

    def _due_request(self, now: float) -> bool:
        with self._lock:
            due = bisect.bisect_right(self._requests, now)
            del self._requests[:due]
        return due > 0

    def _run(self) -> None:
        next_t = time.monotonic()
        rng = random.Random()
        while not self._stop.is_set():
            now = time.monotonic()
            regular = now >= next_t
            if regular or self._due_request(now):
                if not regular:
                    self.requested += 1
                self.sample_once()
            if regular:
                # Dithered schedule (0.5-1.5x the interval, the same rate on average): a
                # job whose short bursts repeat at the sampling period (inference batches at
                # 10/s against 100 ms samples) would otherwise be sampled at one phase, in
                # its gaps every time. If reading fell behind, restart from now, no burst.
                next_t += self.interval_s * (1.0 + SAMPLE_DITHER * (2.0 * rng.random() - 1.0))
                if next_t < now:
                    next_t = now + self.interval_s
            # cleared before the deadline is read: a request made after this is not missed
            self._wake.clear()
            with self._lock:
                wake_at = min(next_t, self._requests[0]) if self._requests else next_t
            self._wake.wait(max(0.0, wake_at - time.monotonic()))

    def samples_between(self, t0: float, t1: float) -> list[tuple[float, float]]:
        """Samples with t0 <= t <= t1 (time.monotonic() seconds)."""
        with self._lock:
            return [s for s in self._buf if t0 <= s[0] <= t1]

    def mean_between(self, t0: float, t1: float) -> float | None:
        samples = self.samples_between(t0, t1)
        return sum(w for _, w in samples) / len(samples) if samples else None

    def latest(self) -> tuple[float, float] | None:
        with self._lock:
            return self._buf[-1] if self._buf else None
