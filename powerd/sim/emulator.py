"""A trace-driven Jetson: reacts to writes in a tree from `build_tree` like a kernel would.

One background thread, woken by inotify (IN_CLOSE_WRITE, which keeps the order of the
writes) and by its own timers; no polling loop. Writes are judged against the emulator's
own model of the accepted limits, in the order they happened, so a wrong write order or
a missing read-back shows up in tests:

- a write that would make min > max is rejected like an older kernel's EINVAL, as is a
  cpufreq write to a cluster with no online core (EBUSY): the file gets its old value back;
- an EMC rate written while `mrq_rate_locked` is 0 is ignored (DVFS keeps the rate);
- `cur` files follow the accepted max after a short delay (10-30 ms x time_scale).

Faults it can inject: `offline_reads_fail=True` makes an inactive cpufreq policy's files
(all its cores offline) fail every open, like the EBUSY of a real kernel: each file is
swapped for a directory (which root cannot read either) until a core comes back.

Every few tens of ms the INA3221 files are rewritten so that the board total equals the
trace power of the *effective* mode (what the cur/online files say), with an exponential
settling transient after a switch and gaussian noise. Rejected writes are logged in
`rejected_writes`. The emulator is test and demo infrastructure; production code never
knows it is there.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import ctypes.util
import functools
import logging
import math
import os
import random
import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from powerd.device.detect import find_gpu_devfreq
from powerd.device.errors import SysfsReadError
from powerd.device.sysfs import DeviceRoot, format_cpu_list, parse_cpu_list, read_int, read_text
from powerd.modes import PowerMode
from powerd.sim.boards import (
    CPU_DIR,
    EMC_CLK_DIR,
    SIM_BOARDS,
    THERMAL_ZONES,
    SimBoard,
    get_sim_board,
)
from powerd.sim.memfs import IN_MEMORY, fs_type
from powerd.sim.trace import Trace
from powerd.sim.tree import TreeLayout, find_layout

log = logging.getLogger(__name__)

# inotify(7)
_IN_CLOSE_WRITE = 0x00000008
_IN_Q_OVERFLOW = 0x00004000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")


class _Inotify:
    """Minimal ctypes binding: the standard library has none, and no dependency is needed."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd

    def watch(self, path: Path, mask: int = _IN_CLOSE_WRITE) -> int:
        wd = self._add(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        return int(wd)

    def read(self) -> list[tuple[int, int, str]]:
        """Pending events as (wd, mask, name), oldest first."""
        out: list[tuple[int, int, str]] = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            off = 0
            while off < len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
                off += _EVENT.size
                name = buf[off : off + length].rstrip(b"\0").decode(errors="replace")
                off += length
                out.append((wd, mask, name))

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class RejectedWrite:
    """A write the emulated kernel refused; the file was put back to `kept`."""

    time: float  # time.monotonic()
    path: str  # as on a real board: /sys/...
    value: str
    kept: str
    reason: str


@dataclass(frozen=True)
class SeenWrite:
    """Every write the emulator processed, in order (accepted or not)."""

    time: float
    path: str
    value: str
    accepted: bool


@dataclass
class _Window:
    """The kernel's accepted [min, max] of a cpufreq policy or devfreq device."""

    table: list[int]
    min: int
    max: int
    cur: int
    min_path: Path
    max_path: Path
    cur_path: Path

    def governor_freq(self) -> int:
        """Under a training load the governor runs at the max limit (the table entry at or
        below it, never below the min)."""
        below = [f for f in self.table if self.min <= f <= self.max]
        if below:
            return below[-1]
        return min(self.table, key=lambda f: abs(f - self.max))


# What an inactive policy refuses to show (EBUSY on a kernel) when that fault is injected.
_OFFLINE_UNREADABLE = (
    "scaling_min_freq",
    "scaling_max_freq",
    "scaling_cur_freq",
    "scaling_available_frequencies",
    "cpuinfo_min_freq",
    "cpuinfo_max_freq",
)


def idle_power_w(trace: Trace) -> float:
    """A plausible idle draw for the board a trace was measured on: below its lowest
    training power (Orin AGX ~9 W, Orin Nano ~6 W with the bundled traces)."""
    return 0.75 * min(r.power_w for r in trace.rows)


def _replace_file(path: Path, text: str) -> None:
    """Atomic replace, so a reader in another process never sees a half-written value."""
    tmp = path.with_name(f".{path.name}.emu")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _put_back(path: Path, text: str) -> None:
    # In place (not a rename) so the inode stays the one writers have open.
    with open(path, "w") as f:
        f.write(text)


class Emulator:
    """Runs the kernel side of an emulated board. Use as a context manager or start()/stop().

    time_scale < 1 makes every emulated delay (cur updates, power settling) shorter.
    """

    def __init__(
        self,
        root: Path | str,
        board: str | SimBoard,
        trace: Trace | str | Path,
        time_scale: float = 1.0,
        seed: int = 0,
        noise_frac: float = 0.01,
        *,
        settle_tau_s: float = 0.3,
        power_interval_s: float = 0.05,
        sensor_update_ms: int | None = None,
        thermal_interval_s: float = 1.0,
        cur_delay_s: tuple[float, float] = (0.010, 0.030),
        coalesce_s: float = 0.002,
        offline_reads_fail: bool = False,
        idle_w: float | None = None,
    ):
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.root = Path(root).absolute()
        self.board = get_sim_board(board)
        self.trace = trace if isinstance(trace, Trace) else Trace.load(trace)
        self.layout: TreeLayout = find_layout(self.root, self.board)
        self.time_scale = time_scale
        self.noise_frac = noise_frac
        self.settle_tau_s = settle_tau_s * time_scale
        self.power_interval_s = power_interval_s
        # The INA3221's conversion cycle (hwmon update_interval, whole ms): a load step shows
        # in the files at the end of the first conversion that began after it. The driver's
        # default cycle, 6.6 ms, is scaled with the rest of the emulated time.
        if sensor_update_ms is None:
            sensor_update_ms = max(1, round(6.6 * time_scale))
        if sensor_update_ms < 1:
            raise ValueError("sensor_update_ms must be >= 1")
        self.sensor_update_ms = sensor_update_ms
        self._conversions: list[float] = []  # pending conversion ends (load steps to show)
        self._conv_phase = 0.0
        self.thermal_interval_s = thermal_interval_s
        self.cur_delay_s = (cur_delay_s[0] * time_scale, cur_delay_s[1] * time_scale)
        self.coalesce_s = coalesce_s
        # Load model (with idle_w): the board carries a job's load exactly while something
        # holds it away from its boot state (powerd pins a mode for each job it serves). Left
        # at its boot state, the governors idle and the board draws idle_w, not the traced
        # training power of its top clocks. Without idle_w: always loaded.
        self.idle_w = idle_w
        self._online_dirty = False
        self._offline_reads_fail = offline_reads_fail
        self._hidden: set[int] = set()  # policies whose files are swapped out (offline)
        self._rng = random.Random(seed)
        self._dev = DeviceRoot(self.root)
        self._lock = threading.RLock()
        self._rejected: list[RejectedWrite] = []
        self._seen: collections.deque[SeenWrite] = collections.deque(maxlen=10_000)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._inotify: _Inotify | None = None
        self._wake_r = self._wake_w = -1
        self._handlers: dict[tuple[int, str], Callable[[Path], None]] = {}
        self._watch_dirs: dict[int, Path] = {}
        self._due: dict[str, float] = {}  # timer name -> time.monotonic() deadline
        self.errors = 0  # exceptions inside the thread (logged; the thread goes on)
        # What the GPU runs right now, as "mode -> board power" (powerd.sim.gpu sets it);
        # None: the trace's power (a training job running flat out).
        self._load: Callable[[PowerMode], float] | None = None
        self._load_state()

    # -- model ---------------------------------------------------------------------------
    def _load_state(self) -> None:
        """The model starts from what the files say (a fresh tree, or one left by a run)."""
        lay = self.layout
        self._online: set[int] = set(parse_cpu_list(read_text(lay.cpu_dir / "online")))
        self._online.add(0)
        self._policies: dict[int, _Window] = {}
        for first, pdir in lay.policies.items():
            table = sorted(
                int(x) for x in read_text(pdir / "scaling_available_frequencies").split()
            )
            self._policies[first] = _Window(
                table,
                read_int(pdir / "scaling_min_freq"),
                read_int(pdir / "scaling_max_freq"),
                read_int(pdir / "scaling_cur_freq"),
                pdir / "scaling_min_freq",
                pdir / "scaling_max_freq",
                pdir / "scaling_cur_freq",
            )
        g = lay.gpu_devfreq
        self._gpu = _Window(
            sorted(int(x) for x in read_text(g / "available_frequencies").split()),
            read_int(g / "min_freq"),
            read_int(g / "max_freq"),
            read_int(g / "cur_freq"),
            g / "min_freq",
            g / "max_freq",
            g / "cur_freq",
        )
        self._railgate = read_int(lay.gpu_device / "railgate_enable")
        self._emc_rates = sorted(int(x) * 1000 for x in read_text(lay.emc_rates_file).split())
        self._emc_locked = read_int(lay.emc_dir / "mrq_rate_locked")
        self._emc_rate = read_int(lay.emc_dir / "rate")
        self._effective = self._compute_effective()
        self._boot = self._knob_state()
        self._loaded = False
        now = time.monotonic()
        target = self._load_power()
        self._p_from = self._p_target = target
        self._t_switch = now
        self._last_power_w = target

    def _knob_state(self) -> tuple:
        windows = [*self._policies.values(), self._gpu]
        return (frozenset(self._online), self._emc_locked, [(w.min, w.max) for w in windows])

    def _load_power(self) -> float:
        """The settled power for the effective mode and the load: what `set_load` says runs
        on the GPU, else the trace's training power while a job holds the board (see
        `idle_w`)."""
        if self._load is not None:
            return self._load(self._effective)
        if self._loaded or self.idle_w is None:
            return self.trace.lookup(self._effective).power_w
        return self.idle_w

    @property
    def loaded(self) -> bool:
        """True while the board runs a job's load (held away from its boot state)."""
        with self._lock:
            return self._loaded

    def _cluster(self, first: int) -> tuple[int, ...]:
        return next(c for c in self.board.clusters if c[0] == first)

    def _policy_active(self, first: int) -> bool:
        return bool(self._online & set(self._cluster(first)))

    def _compute_effective(self) -> PowerMode:
        cpu0 = self._policies[self.layout.policy_of(0)]
        return PowerMode(len(self._online), cpu0.cur, self._gpu.cur, self._emc_rate)

    def effective_mode(self) -> PowerMode:
        """The mode the board runs: online cores, the cur clocks, the EMC rate."""
        with self._lock:
            return self._effective

    def target_power_w(self) -> float:
        """The trace power of the effective mode (noise-free, fully settled)."""
        with self._lock:
            return self._p_target

    def power_w(self) -> float:
        """The noise-free total power right now (inside the settling transient)."""
        with self._lock:
            return self._settled_power(time.monotonic())

    @property
    def last_power_w(self) -> float:
        """The total last written to the INA3221 files (with noise)."""
        return self._last_power_w

    @property
    def rejected_writes(self) -> list[RejectedWrite]:
        with self._lock:
            return list(self._rejected)

    @property
    def seen_writes(self) -> list[SeenWrite]:
        with self._lock:
            return list(self._seen)

    def clear_logs(self) -> None:
        with self._lock:
            self._rejected.clear()
            self._seen.clear()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> Emulator:
        if self._thread is not None:
            return self
        self._inotify = _Inotify()
        self._handlers.clear()  # watch descriptors belong to one inotify instance
        self._watch_dirs.clear()
        self._watch_knobs()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping.clear()
        # Writes made between construction and now are judged before anything else.
        self._resync()
        with self._lock:
            self._update_hidden()
        # Readers started right after start() must already see this board's power.
        for hdir in self.layout.hwmon.values():
            _replace_file(hdir / "update_interval", f"{self.sensor_update_ms}\n")
        now = time.monotonic()
        with self._lock:
            self._conv_phase = now
            self._write_power(now)
            self._write_thermal()
            self._due.update(
                power=now + self.power_interval_s, thermal=now + self.thermal_interval_s
            )
        self._thread = threading.Thread(target=self._run, name=f"emulator-{self.board.name}")
        self._thread.daemon = True
        self._thread.start()
        log.info("emulating %s under %s (trace %s)", self.board.name, self.root, self.trace.name)
        kind = fs_type(self.root)  # None: no mount table to tell
        if kind is not None and kind not in IN_MEMORY:
            log.warning(
                "the emulated tree %s is on %s, not in memory: its power files are rewritten "
                "every %.0f ms and a busy disk stalls those writes, and the emulated steps "
                "with them; build it under /dev/shm",
                self.root,
                kind,
                self.power_interval_s * 1000,
            )
        return self

    def set_offline_reads_fail(self, enabled: bool) -> None:
        """Inject (or stop injecting) unreadable cpufreq files on offline clusters."""
        with self._lock:
            self._offline_reads_fail = enabled
            self._update_hidden()

    def _update_hidden(self) -> None:
        for first, pdir in self.layout.policies.items():
            hide = self._offline_reads_fail and not self._policy_active(first)
            if hide and first not in self._hidden:
                for name in _OFFLINE_UNREADABLE:
                    if (pdir / name).is_file():
                        os.replace(pdir / name, pdir / f".{name}.offline")
                        (pdir / name).mkdir()
                self._hidden.add(first)
            elif not hide and first in self._hidden:
                for name in _OFFLINE_UNREADABLE:
                    if (pdir / f".{name}.offline").exists():
                        (pdir / name).rmdir()
                        os.replace(pdir / f".{name}.offline", pdir / name)
                self._hidden.discard(first)

    def stop(self) -> None:
        with self._lock:  # leave a tree another emulator (or a plain reader) can use
            saved, self._offline_reads_fail = self._offline_reads_fail, False
            self._update_hidden()
            self._offline_reads_fail = saved
        if self._thread is None:
            return
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already
        self._thread.join(timeout=5)
        self._thread = None
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _watch_knobs(self) -> None:
        assert self._inotify is not None
        ino = self._inotify
        lay = self.layout

        def on(directory: Path, name: str, handler: Callable[[Path], None]) -> None:
            # Watch the real directory (writes through cpuN/cpufreq links land there), but
            # name files by the layout's path so logs read like a board's.
            wd = ino.watch(directory.resolve())
            self._watch_dirs.setdefault(wd, directory)
            self._handlers[(wd, name)] = handler

        for cpu in range(1, self.board.ncpu):
            cdir = lay.cpu_dir / f"cpu{cpu}"
            on(cdir, "online", functools.partial(self._on_online, cpu))
        for first, pdir in lay.policies.items():
            on(pdir, "scaling_min_freq", functools.partial(self._on_policy, first, "min"))
            on(pdir, "scaling_max_freq", functools.partial(self._on_policy, first, "max"))
        on(lay.gpu_devfreq, "min_freq", functools.partial(self._on_gpu, "min"))
        on(lay.gpu_devfreq, "max_freq", functools.partial(self._on_gpu, "max"))
        on(lay.gpu_device, "railgate_enable", self._on_railgate)
        on(lay.emc_dir, "mrq_rate_locked", self._on_emc_lock)
        on(lay.emc_dir, "rate", self._on_emc_rate)

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        assert self._inotify is not None
        poller = select.poll()
        poller.register(self._inotify.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopping.is_set():
            with self._lock:
                timeout_s = max(0.0, min(self._due.values()) - time.monotonic())
            try:
                ready = poller.poll(math.ceil(timeout_s * 1000))
            except InterruptedError:
                continue
            if self._stopping.is_set():
                break
            if any(fd == self._wake_r for fd, _ in ready):
                self._drain_wake()
            try:
                if any(fd == self._inotify.fd for fd, _ in ready):
                    # Let a burst of writes (one mode switch) finish before judging it:
                    # the events keep their order, and a writer in this same process is
                    # not slowed down by a GIL ping-pong on every single write.
                    time.sleep(self.coalesce_s)
                    self._drain_events()
                self._run_timers()
            except Exception:  # the emulated kernel must not die on one bad event
                self.errors += 1
                log.exception("emulator %s: error while handling events", self.board.name)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _drain_events(self) -> None:
        with self._lock:
            self._drain_pending()
            self._flush()

    def _drain_pending(self) -> bool:
        """Handle the inotify events already queued, without waiting (caller holds the lock
        and flushes after); True if there were any."""
        assert self._inotify is not None
        events = self._inotify.read()
        for wd, mask, name in events:
            if mask & _IN_Q_OVERFLOW:
                log.warning("inotify queue overflow: re-reading every knob file")
                self._resync()
                continue
            handler = self._handlers.get((wd, name))
            if handler is not None:
                handler(self._file_of(wd, name))
        return bool(events)

    def _resync(self) -> None:
        """Judge every knob file's current content (start-up, or after lost events)."""
        with self._lock:
            for (wd, name), handler in self._handlers.items():
                handler(self._file_of(wd, name))
            self._flush()

    def _run_timers(self) -> None:
        now = time.monotonic()
        with self._lock:
            timers = list(self._due.items())
        for name, due in timers:
            if due > now:
                continue
            with self._lock:
                if name == "power":
                    self._write_power(now)
                    self._due[name] = now + self.power_interval_s
                elif name == "conversion":
                    self._write_power(now)
                    self._conversions = [c for c in self._conversions if c > now]
                    if self._conversions:
                        self._due[name] = self._conversions[0]
                    else:
                        del self._due[name]
                elif name == "thermal":
                    self._write_thermal()
                    self._due[name] = now + self.thermal_interval_s
                else:
                    del self._due[name]
                    # A kernel handles a write before it returns, so a delayed clock
                    # change never acts on state older than the writes already made:
                    # judge those first (a lock written just before the timer fired).
                    if self._drain_pending():
                        self._flush()
                    self._follow(name)

    # -- write handling ------------------------------------------------------------------
    def _file_of(self, wd: int, name: str) -> Path:
        # A directory watched twice (min and max in one dir) returns the same wd.
        return self._watch_dirs[wd] / name

    def _read_written(self, path: Path) -> str | None:
        """The written text; None while a writer is between truncate and write (its own
        IN_CLOSE_WRITE follows)."""
        try:
            text = path.read_text().strip()
        except OSError:
            return None
        return text or None

    def _rel(self, path: Path) -> str:
        return self._dev.rel(path)

    def _seen_write(self, path: Path, value: str, accepted: bool) -> None:
        self._seen.append(SeenWrite(time.monotonic(), self._rel(path), value, accepted))

    def _reject(self, path: Path, value: str, kept: int | str, reason: str) -> None:
        kept_s = str(kept)
        self._rejected.append(
            RejectedWrite(time.monotonic(), self._rel(path), value, kept_s, reason)
        )
        self._seen_write(path, value, False)
        log.debug("rejected %r -> %s: %s", value, self._rel(path), reason)
        _put_back(path, kept_s + "\n")

    def _parse_int(self, path: Path, value: str, kept: int) -> int | None:
        try:
            return int(value)
        except ValueError:
            self._reject(path, value, kept, "not an integer (EINVAL)")
            return None

    def _schedule(self, name: str) -> None:
        self._arm(name, time.monotonic() + self._rng.uniform(*self.cur_delay_s))

    def _arm(self, name: str, at: float) -> None:
        self._due[name] = at
        if self._wake_w >= 0 and threading.current_thread() is not self._thread:
            try:  # the loop sleeps until its earliest timer: tell it about this one
                os.write(self._wake_w, b"t")
            except BlockingIOError:
                pass  # a wake-up is already pending

    def _on_online(self, cpu: int, path: Path) -> None:
        value = self._read_written(path)
        current = 1 if cpu in self._online else 0
        if value is None or value == str(current):
            return
        if value not in ("0", "1"):
            self._reject(path, value, current, "online takes 0 or 1 (EINVAL)")
            return
        self._seen_write(path, value, True)
        if value == "1":
            self._online.add(cpu)
            self._schedule(f"policy{self.layout.policy_of(cpu)}")  # back at its limits
        else:
            self._online.discard(cpu)
        self._online_dirty = True

    def _flush(self) -> None:
        """After a batch of writes: the files a kernel derives from them, and the power
        model's view of the effective mode (once per batch, not per write)."""
        if self._online_dirty:
            self._online_dirty = False
            online = sorted(self._online)
            offline = sorted(set(range(self.board.ncpu)) - self._online)
            _replace_file(self.layout.cpu_dir / "online", format_cpu_list(online) + "\n")
            _replace_file(self.layout.cpu_dir / "offline", format_cpu_list(offline) + "\n")
            for first, pdir in self.layout.policies.items():
                affected = [c for c in self._cluster(first) if c in self._online]
                _replace_file(pdir / "affected_cpus", " ".join(map(str, affected)) + "\n")
            self._update_hidden()
        self._update_effective()

    def _on_limit(self, window: _Window, which: str, path: Path, busy: str | None) -> None:
        value = self._read_written(path)
        old = window.min if which == "min" else window.max
        if value is None or value == str(old):
            return
        freq = self._parse_int(path, value, old)
        if freq is None:
            return
        if busy:
            self._reject(path, value, old, busy)
            return
        # Out-of-table values are clamped to the hardware range, as cpufreq/devfreq do.
        freq = max(window.table[0], min(window.table[-1], freq))
        new_min = freq if which == "min" else window.min
        new_max = freq if which == "max" else window.max
        if new_min > new_max:
            self._reject(
                path, value, old, f"min {new_min} > max {new_max} (EINVAL on older kernels)"
            )
            return
        self._seen_write(path, value, True)
        window.min, window.max = new_min, new_max
        if str(freq) != value:
            _put_back(path, f"{freq}\n")

    def _on_policy(self, first: int, which: str, path: Path) -> None:
        busy = None if self._policy_active(first) else "no online CPU in this policy (EBUSY)"
        window = self._policies[first]
        before = (window.min, window.max)
        self._on_limit(window, which, path, busy)
        if (window.min, window.max) != before:
            self._schedule(f"policy{first}")

    def _on_gpu(self, which: str, path: Path) -> None:
        before = (self._gpu.min, self._gpu.max)
        self._on_limit(self._gpu, which, path, None)
        if (self._gpu.min, self._gpu.max) != before:
            self._schedule("gpu")

    def _on_railgate(self, path: Path) -> None:
        value = self._read_written(path)
        if value is None or value == str(self._railgate):
            return
        if value not in ("0", "1"):
            self._reject(path, value, self._railgate, "railgate_enable takes 0 or 1 (EINVAL)")
            return
        self._seen_write(path, value, True)
        self._railgate = int(value)

    def _on_emc_lock(self, path: Path) -> None:
        value = self._read_written(path)
        if value is None or value == str(self._emc_locked):
            return
        if value not in ("0", "1"):
            self._reject(path, value, self._emc_locked, "mrq_rate_locked takes 0 or 1 (EINVAL)")
            return
        self._seen_write(path, value, True)
        self._emc_locked = int(value)
        if not self._emc_locked:
            self._schedule("emc")  # DVFS takes the clock back

    def _on_emc_rate(self, path: Path) -> None:
        value = self._read_written(path)
        if value is None or value == str(self._emc_rate):
            return
        rate = self._parse_int(path, value, self._emc_rate)
        if rate is None:
            return
        if not self._emc_locked:
            self._reject(
                path,
                value,
                self._emc_rate,
                "EMC not locked (mrq_rate_locked=0): DVFS keeps the rate",
            )
            return
        # BPMP rounds up to a supported rate.
        supported = next((r for r in self._emc_rates if r >= rate), self._emc_rates[-1])
        self._seen_write(path, value, True)
        self._emc_rate = supported
        if str(supported) != value:
            _put_back(path, f"{supported}\n")

    def _follow(self, name: str) -> None:
        """A delayed clock change: the cur file (or the DVFS-owned EMC rate) catches up."""
        if name == "gpu":
            self._gpu.cur = self._gpu.governor_freq()
            _replace_file(self._gpu.cur_path, f"{self._gpu.cur}\n")
            _replace_file(self.layout.gpu_devfreq / "target_freq", f"{self._gpu.cur}\n")
        elif name == "emc":
            if not self._emc_locked:
                self._emc_rate = self._emc_rates[-1]  # DVFS under a training load: the top
                _put_back(self.layout.emc_dir / "rate", f"{self._emc_rate}\n")
        elif name.startswith("policy"):
            first = int(name[len("policy") :])
            if not self._policy_active(first):
                return
            window = self._policies[first]
            window.cur = window.governor_freq()
            _replace_file(window.cur_path, f"{window.cur}\n")
        self._update_effective()

    # -- power and temperature -----------------------------------------------------------
    def set_load(self, load: Callable[[PowerMode], float] | None) -> None:
        """Board power follows what runs: `load(mode)` is the power of the work now on the
        GPU (a training step, an inference batch, idle); None: back to the trace's power."""
        with self._lock:
            self._load = load
            # A load change is a step (the rails follow within microseconds); a mode
            # switch's settling transient, if one is under way, carries on around it.
            delta = self._load_power() - self._p_target
            self._p_from += delta
            self._p_target += delta
            if delta:
                self._convert_after(time.monotonic())

    def _convert_after(self, t: float) -> None:
        """Show the load at `t` in the files when the first conversion begun after `t` ends
        (conversions run back to back from start(); a reading in between shows the last
        finished one, as the chip's registers do). Caller holds the lock."""
        if self._thread is None:
            return
        cycle = self.sensor_update_ms / 1000.0
        end = self._conv_phase + (math.floor((t - self._conv_phase) / cycle) + 2) * cycle
        if end not in self._conversions:
            bisect.insort(self._conversions, end)
        self._arm("conversion", self._conversions[0])

    def _settled_power(self, now: float) -> float:
        if self.settle_tau_s <= 0:
            return self._p_target
        decay = math.exp(-(now - self._t_switch) / self.settle_tau_s)
        return self._p_target + (self._p_from - self._p_target) * decay

    def _update_effective(self) -> None:
        mode = self._compute_effective()
        loaded = self._knob_state() != self._boot
        if mode == self._effective and loaded == self._loaded:
            return
        now = time.monotonic()
        self._p_from = self._settled_power(now)
        self._effective = mode
        self._loaded = loaded
        self._p_target = self._load_power()
        self._t_switch = now
        log.debug("effective mode %s%s -> %.2f W", mode, "" if loaded else " idle", self._p_target)

    def _rail_weights(self) -> dict[str, float]:
        m = self._effective
        cpu_table = self._policies[self.layout.policy_of(0)].table
        g = m.gpu_hz / self._gpu.table[-1]
        c = (m.cores / self.board.ncpu) * (m.cpu_khz / cpu_table[-1])
        e = m.emc_hz / self._emc_rates[-1] if self._emc_rates else 0.0
        return {r.label: r.base + r.gpu * g + r.cpu * c + r.emc * e for r in self.board.rails}

    def freeze_power(self, frozen: bool = True) -> None:
        """Fault injection: a power sensor whose readings stop changing (files not rewritten)."""
        self._power_frozen = frozen

    def _write_power(self, now: float) -> None:
        if getattr(self, "_power_frozen", False):
            return
        total_w = self._settled_power(now)
        if self.noise_frac > 0:
            total_w *= 1.0 + self._rng.gauss(0.0, self.noise_frac)
        total_w = max(total_w, 0.1)
        self._last_power_w = total_w
        weights = self._rail_weights()
        has_total = any(r.total for r in self.board.rails)
        # With an input rail the others are parts of it; without one they add up to it.
        norm = 1.0 if has_total else sum(weights.values())
        currents: dict[str, int] = collections.defaultdict(int)
        for rail in self.board.rails:
            watts = total_w if rail.total else total_w * weights[rail.label] / norm
            mv = rail.millivolts + self._rng.randint(-8, 8)
            ma = round(watts * 1e6 / mv)
            hdir = self.layout.hwmon[rail.device]
            _replace_file(hdir / f"in{rail.channel}_input", f"{mv}\n")
            _replace_file(hdir / f"curr{rail.channel}_input", f"{ma}\n")
            # Shunt voltage (mV) over a 5 mOhm shunt, as the chip reports it.
            _replace_file(hdir / f"in{rail.channel + 3}_input", f"{round(ma * 0.005)}\n")
            currents[rail.device] += ma
        for device, channel in self.board.nc_channels:
            # An unconnected channel reads floating junk: a reader that counts it is wrong
            # by a watt or two.
            hdir = self.layout.hwmon[device]
            _replace_file(hdir / f"in{channel}_input", f"{4900 + self._rng.randint(0, 100)}\n")
            _replace_file(hdir / f"curr{channel}_input", f"{300 + self._rng.randint(0, 50)}\n")
        for device in self.board.shunt_sum_devices:
            hdir = self.layout.hwmon[device]
            _replace_file(hdir / "in7_input", f"{round(currents[device] * 0.005)}\n")
            _replace_file(hdir / "curr4_input", f"{currents[device]}\n")

    def _write_thermal(self) -> None:
        base_c = 30.0 + 0.8 * self._last_power_w
        for zdir, (_kind, offset) in zip(self.layout.thermal_zones, THERMAL_ZONES, strict=False):
            if offset is None:
                continue
            milli = round((base_c + offset + self._rng.gauss(0.0, 0.2)) * 1000)
            _replace_file(zdir / "temp", f"{milli}\n")
        if self.layout.fan_pwm is not None:
            pwm = max(0, min(255, round((base_c - 40.0) * 8)))
            _replace_file(self.layout.fan_pwm, f"{pwm}\n")


@functools.lru_cache(maxsize=16)
def _gpu_devfreq_dir(root: str) -> Path:
    dev = DeviceRoot(root)
    return find_gpu_devfreq(dev, tuple("/" + b.gpu_devfreq for b in SIM_BOARDS.values()))


def read_effective_mode(root: Path | str, attempts: int = 50) -> PowerMode:
    """The mode an emulated board runs, from its files alone (for an emulated job in another
    process): online cores, cpu0's cluster cur clock, the GPU cur clock, the EMC rate.

    Unlike a kernel attribute, a plain file can be read half-written (truncated, not yet
    filled) while the daemon or the emulator writes it: such a read is retried."""
    for attempt in range(attempts):
        try:
            return _read_effective_mode(root)
        except SysfsReadError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.002)  # the writer may be descheduled mid-write on a busy machine
    raise AssertionError("unreachable")


def _read_effective_mode(root: Path | str) -> PowerMode:
    dev = DeviceRoot(root)
    cores = len(parse_cpu_list(read_text(dev.path(f"/{CPU_DIR}/online"))))
    cpu = read_int(dev.path(f"/{CPU_DIR}/cpu0/cpufreq/scaling_cur_freq"))
    gpu = read_int(_gpu_devfreq_dir(str(dev.root)) / "cur_freq")
    rate = dev.path(f"/{EMC_CLK_DIR}/rate")
    emc = read_int(rate) if rate.exists() else 0
    return PowerMode(cores, cpu, gpu, emc)
