"""The client's step queue: bounded, shipped in frames the daemon accepts, never blocking."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from powerd import client as c
from powerd import protocol as p


def _offline_job(tmp_path: Path) -> c.Job:
    """A job whose connection points at no daemon; its thread does not flush."""
    conn = c.Connection(f"ipc://{tmp_path}/nobody.sock")
    job = c.Job(conn, p.JobState(job="j" * 12, phase="profiling", budget_w=20))
    conn.flush = None
    return job


def test_a_backlog_ships_in_frames_the_daemon_accepts(tmp_path: Path) -> None:
    job = _offline_job(tmp_path)
    try:
        n = 2 * p.MAX_STEPS_PER_MSG + 100
        for _ in range(n):
            job.step()
        batches = job._take_batches(time.monotonic(), force=False)
        assert [len(b.t) for b in batches] == [p.MAX_STEPS_PER_MSG, p.MAX_STEPS_PER_MSG, 100]
        for b in batches:
            raw = p.encode(b)
            assert len(raw) <= p.MAX_FRAME_BYTES
            assert p.decode_request(raw) == b
    finally:
        job.close()


def test_steps_appended_out_of_order_are_sent_sorted(tmp_path: Path) -> None:
    job = _offline_job(tmp_path)
    try:
        job._steps.extend([3.0, 1.0, 2.0])  # threads may append out of order
        (batch,) = job._take_batches(time.monotonic(), force=False)
        assert batch.t == [1.0, 2.0, 3.0]
        p.decode_request(p.encode(batch))  # the daemon refuses decreasing timestamps
    finally:
        job.close()


def test_the_queue_is_bounded_and_counts_what_it_dropped(tmp_path: Path) -> None:
    job = _offline_job(tmp_path)
    try:
        extra = 1000
        for _ in range(c.MAX_QUEUED_STEPS + extra):
            job.step()
        assert len(job._steps) == c.MAX_QUEUED_STEPS
        assert job.steps_dropped == extra
    finally:
        job.close()


def test_sends_to_no_daemon_never_block(tmp_path: Path) -> None:
    conn = c.Connection(f"ipc://{tmp_path}/nobody.sock")
    try:
        for _ in range(10 * c.SEND_HWM):
            conn.send(p.Steps(job="j", t=[1.0]))
        deadline = time.monotonic() + 5
        while conn.dropped_sends < 10 * c.SEND_HWM and time.monotonic() < deadline:
            time.sleep(0.01)
        assert conn.dropped_sends == 10 * c.SEND_HWM  # dropped, and the thread is not stuck
        assert conn._thread.is_alive()
    finally:
        conn.close()
    assert not conn._thread.is_alive()


def test_each_batch_reports_the_size_it_ran(tmp_path: Path) -> None:
    conn = c.Connection(f"ipc://{tmp_path}/nobody.sock")
    state = p.JobState(job="i" * 12, phase="tuned", budget_w=20, batch_size=16)
    job = c.InferenceJob(conn, state)
    conn.flush = None
    try:
        with job.batch(size=64):  # formed before powerd moved it to 16
            pass
        with job.batch():  # no size given: the one powerd chose
            pass
        with job.batch(size=16):
            pass
        (msg,) = job._take_batches(time.monotonic(), force=False)
        assert msg.b == [64, 16, 16] and len(msg.d) == len(msg.t) == 3
        assert p.decode_request(p.encode(msg)) == msg
    finally:
        job.close()


def test_before_the_daemon_answers_the_batch_size_is_one_the_job_can_run(tmp_path: Path) -> None:
    """It read 1 for a job registered with batch_sizes=(8, 16) (a user-testing pass)."""
    conn = c.Connection(f"ipc://{tmp_path}/nobody.sock")
    reg = p.Register(kind="inference", budget_w=15, rate_hz=30, batch_sizes=[16, 8])
    job = c.InferenceJob(conn, p.JobState(job="i" * 12, phase="queued", budget_w=15), reg)
    conn.flush = None
    try:
        assert job.batch_size == 8
        job._state = job._state.model_copy(update={"batch_size": 16})
        assert job.batch_size == 16  # the daemon's choice once it has made one
    finally:
        job.close()


def test_steps_from_two_threads_never_make_a_negative_duration(tmp_path: Path) -> None:
    """A script that steps one job from two threads (a data-loader callback and the loop)
    interleaves: a duration taken against the other thread's later start was negative, the
    daemon's schema refused the batch and the client's connection thread died on it."""
    job = _offline_job(tmp_path)
    try:

        def hammer() -> None:
            for _ in range(20_000):
                job.step()

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert min(job._durations) >= 0.0
        batches = job._take_batches(time.monotonic(), force=False)
        assert sum(len(b.t) for b in batches) == min(40_000, c.MAX_QUEUED_STEPS)
        for b in batches:
            assert p.decode_request(p.encode(b)) == b
    finally:
        job.close()


def test_a_chunk_the_daemon_would_refuse_is_dropped_and_counted_not_raised(
    tmp_path: Path,
) -> None:
    job = _offline_job(tmp_path)
    try:
        job._durations.extend([0.01, -1.0, 0.01])  # whatever put it there
        job._steps.extend([1.0, 2.0, 3.0])
        job._n_steps += 3
        # nothing of the refused chunk is sent (a heartbeat may be, as without steps)
        assert all(not b.t for b in job._take_batches(time.monotonic(), force=False))
        assert job.steps_dropped == 3
        job.step()  # the queue goes on
        (batch,) = job._take_batches(time.monotonic(), force=False)
        assert len(batch.t) == 1 and batch.d[0] >= 0.0
    finally:
        job.close()


def test_a_failing_step_report_does_not_end_the_connection_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="powerd.client")
    conn = c.Connection(f"ipc://{tmp_path}/nobody.sock")
    calls = []

    def flush(now: float) -> list:
        calls.append(now)
        if len(calls) <= 3:
            raise RuntimeError("a bug in building the report")
        return []

    try:
        conn.flush = flush
        conn._wake()
        deadline = time.monotonic() + 5.0
        while len(calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) >= 4  # flushed again after each failure
        assert conn._thread.is_alive()
        # one error with its traceback, not one per flush
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and errors[0].exc_info is not None
    finally:
        conn.close()
