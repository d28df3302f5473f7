"""The client across a daemon restart or outage: the training loop never notices.

A live client keeps calling `job.step()` from its own thread while the real daemon is
stopped (SIGTERM, or SIGKILL like a crash) and started again on the same emulated board.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from waiting import wait_for

import powerd
from powerd import client as c
from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.trace import Trace

TS = 0.03


@pytest.fixture
def board(trace: Trace) -> Iterator[EmulatedBoard]:
    with EmulatedBoard("orin-agx", trace, time_scale=TS, strategy="binary-search") as b:
        b.baseline = knob_snapshot(b.root)  # type: ignore[attr-defined]
        yield b


class TrainingLoop(threading.Thread):
    """A training loop: steps every few ms and must never see an exception."""

    def __init__(self, job: powerd.Job, period_s: float = 0.005):
        super().__init__(daemon=True)
        self.job = job
        self.period_s = period_s
        self.stop_event = threading.Event()
        self.steps = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.job.step()
                self.steps += 1
                time.sleep(self.period_s)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.join(5)
        assert self.error is None, f"the training loop saw {self.error!r}"


def _jobs(board: EmulatedBoard) -> list[dict]:
    try:
        return board.status()["jobs"]
    except Exception:  # noqa: BLE001 - not up yet
        return []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "crash"])
def test_a_live_job_registers_again_after_a_daemon_restart(
    board: EmulatedBoard, sig: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="powerd.client")
    job = powerd.request(budget_w=33, workload="survivor", endpoint=board.endpoint)
    assert isinstance(job, powerd.Job)
    loop = TrainingLoop(job)
    loop.start()
    try:
        wait_for(lambda: job.mode is not None, 20, "a first mode")
        old_id = job.id
        board.stop_daemon(sig)
        time.sleep(0.3)
        board.start_daemon()
        # heartbeats every 300 ms on this board: back within a few of them
        wait_for(
            lambda: [j["id"] for j in _jobs(board)] == [job.id] and job.id != old_id,
            5,
            "the job to register again",
        )
        (record,) = _jobs(board)
        assert record["workload"] == "survivor" and record["budget_w"] == 33
        wait_for(lambda: job.mode is not None, 20, "a mode from the new daemon")
        steps_before = record["steps"]
        wait_for(lambda: _jobs(board)[0]["steps"] > steps_before, 5, "steps to reach it")
    finally:
        loop.stop()
    again = [r for r in caplog.records if "registered again" in r.getMessage()]
    assert len(again) == 1, [r.getMessage() for r in caplog.records]
    job.close()
    wait_for(lambda: not _jobs(board), 5, "the job to end")
    wait_for(lambda: knob_snapshot(board.root) == board.baseline, 10, "the baseline")  # type: ignore[attr-defined]


def test_a_gone_daemon_makes_the_job_a_bounded_no_op_until_it_returns(
    board: EmulatedBoard, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="powerd.client")
    job = powerd.request(budget_w=33, workload="patient", endpoint=board.endpoint)
    assert isinstance(job, powerd.Job)
    loop = TrainingLoop(job, period_s=0.002)
    loop.start()
    try:
        wait_for(lambda: job.mode is not None, 20, "a first mode")
        board.stop_daemon()
        wait_for(lambda: not job.connected, 10, "the job to notice the daemon is gone")
        assert job.phase == "idle" and job.mode is None
        # a burst far beyond what the socket or the queue would hold: memory stays flat
        dropped = job.steps_dropped
        for _ in range(200_000):
            job.step()
        wait_for(lambda: len(job._steps) < 1000, 2, "the queue to be emptied")
        assert job.steps_dropped >= dropped + 200_000 - c.MAX_QUEUED_STEPS
        job.set_budget(40)  # remembered for when the daemon returns, without blocking
        assert job.budget_w == 40  # and said at once
        gone = [r for r in caplog.records if "has not answered" in r.getMessage()]
        assert len(gone) == 1
        board.start_daemon()
        wait_for(
            lambda: job.connected and [j["budget_w"] for j in _jobs(board)] == [40],
            5,
            "the job to register again with the budget set while the daemon was gone",
        )
        wait_for(lambda: job.mode is not None, 20, "a mode from the new daemon")
    finally:
        loop.stop()
    job.close()
    wait_for(lambda: not _jobs(board), 5, "the job to end")


CHILD = """
import sys, time, powerd
job = powerd.request(budget_w=33, workload="stopped", endpoint=sys.argv[1])
print("registered", job.id, flush=True)
while True:
    job.step()
    time.sleep(0.005)
"""


def test_a_client_process_stopped_past_the_heartbeat_says_so_not_that_the_daemon_restarted(
    board: EmulatedBoard,
) -> None:
    """SIGSTOP (Ctrl-Z, a debugger) longer than the heartbeat timeout: the daemon ends the
    job, and the client, continued, registers again. It said "the daemon had lost job ...
    (it restarted)" and "the daemon has not answered for 4 s" (the old client)."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, board.endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(_jobs(board)) == 1, 20, "the child's job")
        (first,) = _jobs(board)
        proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: not _jobs(board), 10, "the daemon to end the silent job")
        time.sleep(0.5)
        proc.send_signal(signal.SIGCONT)
        wait_for(
            lambda: [j["id"] for j in _jobs(board)] not in ([], [first["id"]]),
            10,
            "the job to register again",
        )
        # the daemon lists the new job before the client has read its reply, and the client
        # says why it registered again when it reads it (a CI run killed it in between)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            "this process was stopped for" in ln for ln in lines
        ):
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        reader.join(timeout=10)
    out = "".join(lines)
    assert "this process was stopped for" in out, out
    assert "it restarted" not in out and "has not answered" not in out, out
