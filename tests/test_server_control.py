"""The two paths inside the daemon, with the daemon in this process (so a test can make the
control path hang or fail) on an emulated board, reached through its real sockets."""

import shutil
import socket
import threading
import time

import powerd
from powerd import control
from powerd import protocol as p
from powerd.client import call_once
from powerd.hardware import Hardware
from powerd.server import Daemon, Server
from powerd.sim.emulator import Emulator, read_effective_mode
from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.tree import build_tree

TS = 0.03


class InProcess:
    """An emulated board and `Daemon` + `Server` running on threads of this process."""

    def __init__(self, trace, config=None):
        self.b = EmulatedBoard(
            "orin-nano", trace, time_scale=TS, strategy="binary-search", config=config
        )
        self.trace = trace
        self.endpoint = self.b.endpoint
        self.root = self.b.root

    def __enter__(self):
        b = self.b
        build_tree(b.root, b.board, b.trace, l4t=b.l4t)
        self.baseline = knob_snapshot(b.root)
        self.emulator = Emulator(
            b.root, b.board, b.trace, time_scale=TS, power_interval_s=max(0.004, 0.05 * TS)
        ).start()
        self.hw = Hardware.open(b.config)
        self.daemon = Daemon(b.config, self.hw)
        self.server = Server(self.daemon)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                self.status()
                break
            except Exception:
                assert time.monotonic() < deadline, "in-process daemon did not come up"
                time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.stop_event.set()
        self.thread.join(20)
        self.emulator.stop()
        shutil.rmtree(self.b.dir, ignore_errors=True)

    def status(self):
        reply = call_once(self.endpoint, p.Status(), timeout_s=2.0)
        return reply.status


def _stuck_apply(hw):
    """Make the board's mode switches hang until `gate` is set (a stuck sysfs write)."""
    gate, entered = threading.Event(), threading.Event()
    real = hw.apply

    def stuck(mode):
        entered.set()
        gate.wait(60)
        real(mode)

    hw.apply = stuck
    return gate, entered


class _Stepper:
    def __init__(self, root, trace, job):
        self.root, self.trace, self.job = root, trace, job
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            mode = read_effective_mode(self.root)
            time.sleep(self.trace.lookup(mode).time_ms / 1000 * TS)
            self.job.step()

    def stop(self):
        self._stop.set()
        self._t.join()


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_requests_are_answered_while_the_control_path_is_stuck_in_a_switch(nano_trace):
    """Fails on the single-loop daemon: its replies waited behind the stuck switch."""
    with InProcess(nano_trace) as d:
        gate, entered = _stuck_apply(d.hw)
        try:
            job = powerd.request(budget_w=12, workload="stuck", endpoint=d.endpoint)
            assert entered.wait(10), "the control path never switched a mode"
            t0 = time.monotonic()
            job.set_budget(14)
            assert job.budget_w == 14 and job.phase != "tuned"
            s = d.status()
            assert [j["budget_w"] for j in s["jobs"]] == [14]
            other = powerd.request(budget_w=20, workload="other", endpoint=d.endpoint)
            assert other.phase == "queued"
            other.close()
            job.close()
            # nothing above waited for the switch (it is still stuck)
            assert time.monotonic() - t0 < 3.0
            assert not gate.is_set()
            assert d.status()["jobs"] == []
        finally:
            gate.set()
        # once unstuck, the control path gives the board back (no job is left)
        wait_for(lambda: knob_snapshot(d.root) == d.baseline, 10, "baseline restore")


def test_a_hung_control_path_stops_the_watchdog_pings_not_the_replies(
    nano_trace, monkeypatch, tmp_path
):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    notify.bind(path)
    notify.settimeout(0.05)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s

    def pings(seconds):
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                n += notify.recv(4096).decode().count("WATCHDOG=1")
            except TimeoutError:
                pass
        return n

    try:
        with InProcess(nano_trace) as d:
            assert pings(1.0) >= 4  # a healthy control path pings
            gate, entered = _stuck_apply(d.hw)
            try:
                job = powerd.request(budget_w=12, workload="hung", endpoint=d.endpoint)
                assert entered.wait(10)
                pings(0.15)  # one ping may have left just before the hang
                hung = pings(1.2)
                # the request path is alive and answering, yet no ping: systemd will kill it
                assert d.status()["jobs"][0]["id"] == job.id
                assert hung == 0
            finally:
                gate.set()
            assert pings(1.0) >= 4  # progress again, pings again
            job.close()
    finally:
        notify.close()


def test_an_exception_in_the_control_tick_releases_the_job_and_keeps_serving(nano_trace):
    """Fails on the single-loop daemon: a non-TunerFailed exception ended the daemon."""
    with InProcess(nano_trace) as d:
        real = d.hw.power_between
        broken = threading.Event()

        def power_between(t0, t1):
            if broken.is_set():
                raise ZeroDivisionError("injected fault in the power path")
            return real(t0, t1)

        d.hw.power_between = power_between
        job = powerd.request(budget_w=12, workload="faulty", endpoint=d.endpoint)
        stepper = _Stepper(d.root, nano_trace, job)
        try:
            wait_for(lambda: d.status()["jobs"][0]["phase"] == "profiling", 20, "profiling")
            wait_for(lambda: d.hw.current_mode is not None, 20, "a probe pinned")
            broken.set()
            wait_for(lambda: job.phase == "idle", 10, "the job released")
            broken.clear()
            assert "ZeroDivisionError" in job.message and "baseline" in job.message
            wait_for(lambda: knob_snapshot(d.root) == d.baseline, 10, "baseline restore")
            s = d.status()
            fault = s["faults"][-1]
            assert fault["kind"] == "control_tick" and fault["job"] == job.id
            assert fault["mode"] is not None
            # the daemon keeps serving: a new job is planned as usual
            with powerd.request(budget_w=12, workload="next", endpoint=d.endpoint) as nxt:
                s2 = _Stepper(d.root, nano_trace, nxt)
                try:
                    wait_for(lambda: nxt.phase == "profiling", 20, "the next job profiles")
                finally:
                    s2.stop()
            assert job.phase == "idle"  # the released job stays released
        finally:
            stepper.stop()
            job.close()


def test_after_giving_up_on_refused_switches_the_job_reads_idle_not_tuned(nano_trace):
    """Fails on the old daemon: it said `tuned` with the board at its baseline."""
    with InProcess(nano_trace) as d:

        def refuse(mode):
            raise OSError(f"EBUSY writing {mode}")

        d.hw.apply = refuse
        with powerd.request(budget_w=12, workload="refused", endpoint=d.endpoint) as job:
            wait_for(lambda: job.phase == "idle", 20, "the job released")
            assert "TunerFailed" in job.message and "EBUSY" in job.message
            assert job.mode is None
            s = d.status()
            assert s["mode"] is None and s["jobs"][0]["phase"] == "idle"
            assert s["faults"][-1]["job"] == job.id
            time.sleep(0.3)
            assert job.phase == "idle"  # released for good, not re-planned in a loop
        assert knob_snapshot(d.root) == d.baseline


def test_a_failed_restore_is_retried_while_the_released_job_stays_connected(nano_trace):
    """Fails on the old daemon: it retried only once no job was registered at all, so a
    released job that kept stepping (hours of training) kept the board half pinned."""
    with InProcess(nano_trace) as d:
        emc_lock = next(d.root.glob("sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked"))
        job = powerd.request(budget_w=12, workload="refused-emc", endpoint=d.endpoint)
        stepper = _Stepper(d.root, nano_trace, job)
        try:
            wait_for(lambda: d.hw.current_mode is not None, 20, "a probe pinned")
            emc_lock.unlink()
            emc_lock.mkdir()  # writes fail now (EISDIR): switches and the restore alike
            wait_for(lambda: job.phase == "idle", 20, "the job released")
            s = d.status()
            assert s["baseline"]["restore_problem"], s["baseline"]
            fault = s["faults"][-1]
            assert fault["kind"] == "control_tick"
            # said in order, once: the switch that failed, then the restore that failed
            assert "restoring the baseline failed too" in fault["message"], fault["message"]
            assert "restored the board to its baseline" not in fault["message"]
            assert "in mode None" not in fault["message"]
            assert fault["message"].count("failed: switch to") == 0, fault["message"]
            assert "restoring the baseline failed too" in job.message
            # the kernel takes writes again; the job is still registered and stepping
            emc_lock.rmdir()
            emc_lock.write_text("1\n")
            wait_for(
                lambda: d.status()["baseline"]["restore_problem"] is None,
                20,
                "the restore retried with the released job connected",
            )
            assert [j["phase"] for j in d.status()["jobs"]] == ["idle"]
            assert knob_snapshot(d.root) == d.baseline
        finally:
            stepper.stop()
            job.close()


def test_a_reading_over_the_abort_line_wakes_the_control_loop_at_once(nano_trace, monkeypatch):
    """The loop sleeps between ticks (here 3 s, to make a late reaction plain); power over
    the budget + the abort margin must end the probe on the reading that shows it."""
    monkeypatch.setattr(control, "LOOP_PERIOD_S", 3.0)
    with InProcess(nano_trace) as d:
        assert d.hw.sampler.watched_w is None  # an idle board: nothing to stop
        job = powerd.request(budget_w=12, workload="overshoot", endpoint=d.endpoint)
        stepper = _Stepper(d.root, nano_trace, job)
        try:
            wait_for(lambda: d.hw.sampler.watched_w == 13.0, 10, "the abort line watched")
            wait_for(lambda: d.hw.current_mode is not None, 20, "a probe pinned")
            samples = d.daemon.control.workloads["training", "overshoot"].samples
            probe = d.hw.current_mode
            assert probe not in samples
            monkeypatch.setattr(d.hw.sampler.reader, "read_w", lambda: 30.0)
            t0 = time.monotonic()
            wait_for(lambda: probe in samples, 10, "the probe measured")
            # stopped on the readings over the line, not a loop period (3 s) later
            assert time.monotonic() - t0 < 1.5
            assert samples[probe].aborted_over_budget and samples[probe].power_w == 30.0
        finally:
            stepper.stop()
            job.close()
        wait_for(lambda: d.hw.sampler.watched_w is None, 10, "the watch ended with the job")
