"""The machine a benchmark runs on: is anything else competing for its cores?

The daemon benchmarks measure step and batch times on the emulator in wall time, so other
CPU-bound work shows up as slower modes (a loaded 2-core machine once turned a 0.5 % mean
penalty into 55 %). They print a note at the start and the end, so a reader can tell.

The verdict comes from CPU time, not from the load average: the machine's busy time
(/proc/stat) less this benchmark's own process tree's (/proc/<pid>/stat), over a second
before the run and over the whole run. A load average decays over minutes, so a sweep
started right after another one used to be called loaded by the one before it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# More runnable work than this share of the cores (1-minute average) counts as loaded,
# where CPU times cannot be read.
LOADED_SHARE = 0.75
# Other work using more than this share of all the cores' time counts as loaded (half a
# core on a 2-core machine: the emulated job and the daemon need about one).
OTHER_CPU_SHARE = 0.25
_WARNING = (
    " -- LOADED: other work competes with the emulated jobs for the cores; "
    "step times (and so the figures) are not the trace's. Rerun on an idle machine."
)
# What reading /proc can raise where it is missing or not Linux's
_UNREADABLE = (OSError, ValueError, IndexError)


def _busy_ticks(proc: Path) -> int:
    """The machine's busy CPU time in clock ticks: every state but idle and iowait."""
    first = (proc / "stat").read_text().splitlines()[0].split()
    if first[0] != "cpu":
        raise ValueError("no aggregate cpu line")
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4]


def _tree_ticks(proc: Path, root: int) -> int:
    """CPU ticks of `root` and every live descendant, with the children each has reaped."""
    parent: dict[int, int] = {}
    spent: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        # comm (field 2) may hold spaces and parentheses: split after its last ")"
        rest = raw[raw.rfind(")") + 2 :].split()
        pid = int(entry.name)
        parent[pid] = int(rest[1])
        spent[pid] = sum(int(x) for x in rest[11:15])  # utime stime cutime cstime
    total = 0
    for pid, ticks in spent.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += ticks
    return total


class CpuWatch:
    """Other work's share of all the cores' time since `start()`."""

    def __init__(self, proc: Path | str = "/proc", root: int | None = None) -> None:
        self.proc = Path(proc)
        self.root = os.getpid() if root is None else root
        self.cores = os.cpu_count() or 1
        self._start: tuple[float, int, int] | None = None

    def _sample(self) -> tuple[float, int, int]:
        return (
            time.monotonic(),
            _busy_ticks(self.proc),
            _tree_ticks(self.proc, self.root),
        )

    def start(self) -> None:
        self._start = self._sample()

    def other_share(self) -> float:
        """Busy ticks not spent by this process tree, over the cores' ticks elapsed."""
        if self._start is None:
            raise RuntimeError("CpuWatch.other_share before start")
        t0, busy0, own0 = self._start
        t1, busy1, own1 = self._sample()
        ticks = (t1 - t0) * os.sysconf("SC_CLK_TCK") * self.cores
        other = (busy1 - busy0) - (own1 - own0)
        return max(0.0, other) / ticks if ticks > 0 else 0.0


def _load_line(when: str, own: float) -> tuple[str, bool]:
    """The load averages against the core count, and whether they alone say loaded."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:  # not every platform reports it
        return f"machine {when}: load average unknown", False
    cores = os.cpu_count() or 1
    line = f"machine {when}: load average {one:.2f} (1 min), {five:.2f} (5 min) on {cores} cores"
    return line, max(one, five) - own > LOADED_SHARE * cores


def load_note(when: str, own: float = 0.0, watch: CpuWatch | None = None) -> str:
    """One line on the machine, with a warning when other work competes for the cores.
    `watch`: judge by the other work's CPU time since it started (the verdict); without
    it, or where /proc cannot be read, by the load averages, less `own` (the load the
    benchmark itself adds: its daemon and job, about 1 while it runs)."""
    line, loaded = _load_line(when, own)
    if watch is not None:
        try:
            share = watch.other_share()
        except (*_UNREADABLE, RuntimeError):  # RuntimeError: a watch never started
            line += "; other work's CPU time unknown"
        else:
            line += f"; other work used {100 * share:.0f} % of the cores' time"
            loaded = share > OTHER_CPU_SHARE
    return line + (_WARNING if loaded else "")


def start_watch(when: str = "at the start", settle_s: float = 1.0) -> tuple[CpuWatch, str]:
    """A watch for the run, and the start's note: other work over the next `settle_s`
    (before the benchmark starts its own daemon and jobs), read by that same watch before
    it starts again for the run."""
    watch = CpuWatch()
    try:
        watch.start()
    except _UNREADABLE:
        return watch, load_note(when)
    time.sleep(settle_s)
    note = load_note(when, watch=watch)
    watch.start()
    return watch, note
