"""The benchmarks' load note: a loaded machine is called out, an idle one is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerd_replay import machine


def _load(monkeypatch: pytest.MonkeyPatch, one: float, five: float, cores: int) -> None:
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (one, five, five))
    monkeypatch.setattr(machine.os, "cpu_count", lambda: cores)


def test_idle_machine_is_not_called_loaded(monkeypatch):
    _load(monkeypatch, 0.3, 0.5, 2)
    note = machine.load_note("at the start")
    assert "0.30 (1 min), 0.50 (5 min) on 2 cores" in note
    assert "LOADED" not in note


def test_other_work_on_the_cores_is_called_loaded(monkeypatch):
    _load(monkeypatch, 4.2, 3.0, 2)
    assert "LOADED" in machine.load_note("at the start")


def test_the_benchmarks_own_load_is_not_held_against_it(monkeypatch):
    _load(monkeypatch, 1.9, 1.2, 2)  # its daemon and job: about one core
    assert "LOADED" in machine.load_note("at the end")
    assert "LOADED" not in machine.load_note("at the end", own=1.0)


def test_unknown_load_is_said(monkeypatch):
    def fail():
        raise OSError("no load average here")

    monkeypatch.setattr(machine.os, "getloadavg", fail)
    assert "unknown" in machine.load_note("at the start")


class FakeProc:
    """A /proc with an aggregate cpu line and a few processes, whose times a test moves."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.busy = 0
        self.idle = 0
        self.procs: dict[int, tuple[str, int, int]] = {}  # pid: comm, ppid, ticks

    def write(self) -> None:
        # user nice system idle iowait irq softirq steal: busy split over user and system
        u, s = self.busy // 2, self.busy - self.busy // 2
        (self.root / "stat").write_text(
            f"cpu  {u} 0 {s} {self.idle} 7 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"
        )
        for pid, (comm, ppid, ticks) in self.procs.items():
            d = self.root / str(pid)
            d.mkdir(exist_ok=True)
            # fields after comm: state ppid pgrp session tty tpgid flags minflt cminflt
            # majflt cmajflt utime stime cutime cstime ...
            a, b = ticks // 2, ticks - ticks // 2
            (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 {a} {b} 0 0 20 0")


@pytest.fixture
def proc(tmp_path, monkeypatch):
    fake = FakeProc(tmp_path)
    clock = {"t": 100.0}
    monkeypatch.setattr(machine.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(machine.os, "sysconf", lambda name: 100)  # clock ticks per second
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)
    fake.clock = clock
    return fake


def test_cpu_watch_counts_only_work_outside_the_benchmarks_process_tree(proc):
    # the benchmark (10), its daemon (11, comm with a space and a parenthesis), the daemon's
    # worker (12); an unrelated process (20) beside them
    proc.procs = {10: ("py", 1, 0), 11: ("powerd) x", 10, 0), 12: ("w", 11, 0), 20: ("gcc", 1, 0)}
    proc.write()
    watch = machine.CpuWatch(proc.root, root=10)
    watch.start()
    # 10 s on 2 cores = 2000 ticks; the tree spends 900, the other process 300
    proc.clock["t"] += 10.0
    proc.procs = {
        10: ("py", 1, 100),
        11: ("powerd) x", 10, 500),
        12: ("w", 11, 300),
        20: ("gcc", 1, 300),
    }
    proc.busy += 1200
    proc.write()
    assert watch.other_share() == pytest.approx(300 / 2000)


def a_second_of_other_work(proc: FakeProc, ticks: int) -> machine.CpuWatch:
    """A watch on the benchmark (pid 10, idle) over a second in which other work spent
    `ticks` of the 2 cores' 200."""
    proc.procs = {10: ("py", 1, 0)}
    proc.write()
    watch = machine.CpuWatch(proc.root, root=10)
    watch.start()
    proc.clock["t"] += 1.0
    proc.busy += ticks
    proc.write()
    return watch


def test_a_decaying_load_average_no_longer_calls_an_idle_machine_loaded(proc, monkeypatch):
    # a sweep just before left the 1-minute load at 1.9; nothing else runs now
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (1.9, 1.2, 1.0))
    watch = a_second_of_other_work(proc, 10)  # 5 % of the cores' time
    note = machine.load_note("at the start", watch=watch)
    assert "other work used 5 %" in note
    assert "LOADED" not in note


def test_other_work_over_a_quarter_of_the_cores_is_called_loaded(proc, monkeypatch):
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    watch = a_second_of_other_work(proc, 120)  # 60 %
    assert "LOADED" in machine.load_note("at the end", own=1.0, watch=watch)


def test_unreadable_cpu_times_fall_back_to_the_load_average(tmp_path, monkeypatch):
    _load(monkeypatch, 4.2, 3.0, 2)
    watch = machine.CpuWatch(tmp_path / "missing", root=10)
    note = machine.load_note("at the end", watch=watch)  # never started: no /proc there
    assert "CPU time unknown" in note
    assert "LOADED" in note
