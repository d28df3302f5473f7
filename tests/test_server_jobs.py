"""Several jobs on one board through the real daemon process: true phases, no re-tune churn,
jobs bound to their connection, per-client limits, workload eviction, a frozen sensor."""

import json
import threading
import time

import pytest
import zmq

import powerd
from powerd import protocol as p
from powerd.sim.emulator import read_effective_mode
from powerd.sim.harness import EmulatedBoard, knob_snapshot

TS = 0.03
SLOW_OK = {"device": {"verify_timeout_ms": 3000}}


@pytest.fixture
def board(nano_trace):
    # generous read-back time: a loaded test machine must not fail switches here
    with EmulatedBoard("orin-nano", nano_trace, time_scale=TS, config=SLOW_OK) as b:
        b.baseline = knob_snapshot(b.root)
        yield b


class Stepper:
    """Steps a job from a thread with the trace's (scaled) step times."""

    def __init__(self, board, job):
        self.board, self.job = board, job
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            mode = read_effective_mode(self.board.root)
            time.sleep(self.board.trace.lookup(mode).time_ms / 1000 * TS)
            self.job.step()

    def stop(self):
        self._stop.set()
        self._t.join()


def wait_for(pred, timeout_s, what, board=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}\n{board.log_tail() if board else ''}"
    )


def pinned(board):
    return board.daemon_log.read_text().count("pinned ")


class Raw:
    """A bare DEALER connection: its own ZeroMQ identity, raw protocol messages."""

    def __init__(self, endpoint):
        self.s = zmq.Context.instance().socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.connect(endpoint)

    def call(self, msg):
        self.s.send(p.encode(msg))
        assert self.s.poll(3000), f"no reply to {msg!r}"
        return p.decode_reply(self.s.recv())

    def close(self):
        self.s.close()


# ---- phases (#10 item 8) -------------------------------------------------------------------


def test_a_job_never_reads_tuned_while_another_workloads_probes_run(board):
    """Fails on the old daemon: the first job read `tuned` during the second's probes."""
    a = powerd.request(budget_w=16, workload="first", endpoint=board.endpoint)
    sa = Stepper(board, a)
    try:
        wait_for(lambda: a.phase == "tuned", 60, "first job tuned", board)
        b = powerd.request(budget_w=10, workload="second", endpoint=board.endpoint)
        sb = Stepper(board, b)
        try:
            seen_queued = set()
            deadline = time.monotonic() + 90
            while True:
                s = board.status()
                jobs = {j["id"]: j for j in s["jobs"]}
                t = s["tuner"]
                if t is not None and t["job"] == b.id and t["state"] != "tuned":
                    # the board runs the second workload's probes: the first is not tuned
                    assert jobs[a.id]["phase"] != "tuned", s
                if jobs[a.id]["phase"] == "queued":
                    seen_queued.add(jobs[a.id]["message"])
                if jobs[a.id]["phase"] == jobs[b.id]["phase"] == "tuned":
                    break
                assert time.monotonic() < deadline, board.log_tail()
                time.sleep(0.01)
            assert any(f"waiting for job {b.id}" in m for m in seen_queued), seen_queued
            wait_for(lambda: a.feasible is True and b.feasible is True, 2, "clients told")
            assert board.trace.lookup(read_effective_mode(board.root)).power_w <= 10.5
        finally:
            sb.stop()
            b.close()
    finally:
        sa.stop()
        a.close()


def test_a_job_that_stops_stepping_while_profiled_gives_its_turn_to_one_that_steps(board):
    """Fails on the old daemon: a job paused mid-profiling (an evaluation, a checkpoint;
    its heartbeat keeps it registered) kept every other workload queued for as long."""
    a = powerd.request(budget_w=14, workload="pauses", endpoint=board.endpoint)
    sa = Stepper(board, a)
    try:
        wait_for(lambda: a.phase == "profiling", 30, "the first job profiling", board)
    finally:
        sa.stop()  # paused, still connected
    b = powerd.request(budget_w=14, workload="steps", endpoint=board.endpoint)
    sb = Stepper(board, b)
    try:
        wait_for(lambda: b.phase == "tuned", 60, "the stepping job tuned", board)
        jobs = {j["id"]: j for j in board.status()["jobs"]}
        assert jobs[a.id]["phase"] == "queued", jobs[a.id]
        assert "no steps for" in jobs[a.id]["message"], jobs[a.id]
        assert "goes first" in board.daemon_log.read_text()
        # it steps again: its own profiling resumes once the board is free
        sa = Stepper(board, a)
        wait_for(lambda: a.phase == "tuned", 60, "the paused job tuned after all", board)
        assert board.trace.lookup(read_effective_mode(board.root)).power_w <= 14.5
    finally:
        sb.stop()
        sa.stop()
        b.close()
        a.close()


def test_an_infeasible_budget_is_not_tuned(board):
    """Fails on the old daemon: a commit that fits no budget read `tuned`."""
    with powerd.request(budget_w=5, workload="tight", endpoint=board.endpoint) as job:
        st = Stepper(board, job)
        try:
            wait_for(lambda: job.feasible is not None, 60, "a decision", board)
            assert job.feasible is False
            assert job.phase == "idle" and "no measured mode fits 5 W" in job.message
            assert job.mode is not None  # it holds the lowest-power mode measured
            # a budget that fits: while it is re-planned, the old verdict is not shown
            job.set_budget(20)
            seen: list[str] = []
            deadline = time.monotonic() + 60
            while (entry := board.status()["jobs"][0])["phase"] != "tuned":
                seen.append(entry["message"])
                assert time.monotonic() < deadline, board.log_tail()
                time.sleep(0.005)
            assert seen and not any("fits 5 W" in m for m in seen), sorted(set(seen))
            assert entry["message"] == "" and job.feasible is not False
        finally:
            st.stop()


@pytest.fixture(params=["binary-search", "powertrain"])
def either_strategy_board(request, nano_trace):
    with EmulatedBoard(
        "orin-nano", nano_trace, time_scale=TS, config=SLOW_OK, strategy=request.param
    ) as b:
        yield b


def test_one_high_window_at_the_lowest_mode_does_not_make_a_budget_infeasible(
    either_strategy_board,
):
    """Fails on the old daemon (a CI run of session 51): the first window at the lowest mode
    read far more than that mode draws, was cut short, and a budget only that mode meets
    was held infeasible for the rest of the job."""
    board = either_strategy_board
    trace = board.trace
    powers = sorted(r.power_w for r in trace.rows)
    budget = round((powers[0] + powers[1]) / 2, 2)  # only the lowest mode meets it
    lowest = min(trace.rows, key=lambda r: r.power_w).mode
    # The board draws the trace's highest power from its first arrival at the lowest mode
    # until the daemon has logged that window (a burst, or a sensor that had not caught up).
    board.emulator.set_load(
        lambda mode: powers[-1] if mode == lowest else trace.lookup(mode).power_w
    )
    done = threading.Event()

    def end_the_burst():
        while not done.is_set():
            if f"measured {lowest}:" in board.daemon_log.read_text():
                board.emulator.set_load(None)
                return
            time.sleep(0.002)

    watcher = threading.Thread(target=end_the_burst, daemon=True)
    watcher.start()
    try:
        with powerd.request(budget_w=budget, workload="burst", endpoint=board.endpoint) as job:
            st = Stepper(board, job)
            try:
                wait_for(lambda: job.feasible is not None, 90, "a decision", board)
                assert job.feasible is True, board.log_tail()
                assert job.phase == "tuned" and job.mode == lowest
            finally:
                st.stop()
    finally:
        done.set()
        watcher.join()
        board.emulator.set_load(None)
    log = board.daemon_log.read_text()
    assert f"measured {lowest}: nan ms/step" in log  # the first window, cut short
    assert "again before calling the budget infeasible" in log


# ---- re-plan only on a change that matters (#10 item 9) ---------------------------------------


def test_a_job_that_does_not_change_the_budget_or_workloads_causes_no_retune(board):
    """Fails on the old daemon: a second job's arrival and departure re-tuned the first."""
    a = powerd.request(budget_w=12, workload="steady", endpoint=board.endpoint)
    sa = Stepper(board, a)
    try:
        wait_for(lambda: a.phase == "tuned", 60, "first job tuned", board)
        mode, n = a.mode, pinned(board)
        phases = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                phases.append(board.status()["jobs"][0]["phase"])
                time.sleep(0.005)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        try:
            # same workload, a higher budget: the board's budget and workloads are unchanged
            b = powerd.request(budget_w=18, workload="steady", endpoint=board.endpoint)
            sb = Stepper(board, b)
            wait_for(lambda: b.phase == "tuned", 10, "second job tuned", board)
            b.set_budget(15)  # still above the effective 12 W
            time.sleep(0.5)
            sb.stop()
            b.close()
            time.sleep(0.5)
        finally:
            stop.set()
            w.join()
        assert set(phases) == {"tuned"}, phases
        assert a.mode == mode and pinned(board) == n, board.log_tail()
    finally:
        sa.stop()
        a.close()


# ---- binding and limits (#8 item 7) ------------------------------------------------------------


@pytest.fixture
def limited_board(nano_trace):
    cfg = {"server": {"max_jobs_per_client": 2, "max_jobs": 3, "max_messages_per_s": 50}}
    with EmulatedBoard("orin-nano", nano_trace, time_scale=TS, config=cfg) as b:
        yield b


def test_another_connection_cannot_close_rebudget_or_feed_a_job(limited_board):
    """Fails on the old daemon: any connection that knew a job id could close it."""
    board = limited_board
    with powerd.request(budget_w=12, workload="mine", endpoint=board.endpoint) as job:
        time.sleep(0.2)
        before = board.status()["jobs"][0]
        intruder = Raw(board.endpoint)
        try:
            for msg in (
                p.Steps(job=job.id, t=[time.monotonic()] * 50),
                p.SetBudget(job=job.id, budget_w=30),
                p.SetRate(job=job.id, rate_hz=10),
                p.Close(job=job.id),
            ):
                reply = intruder.call(msg)
                assert isinstance(reply, p.Error) and reply.code == "unknown_job", reply
                assert job.id in reply.message  # names only what the sender gave
        finally:
            intruder.close()
        after = board.status()["jobs"]
        assert len(after) == 1 and after[0]["id"] == job.id
        assert after[0]["budget_w"] == 12 and after[0]["steps"] == before["steps"]
        job.set_budget(13)  # its own connection still can
        assert board.status()["jobs"][0]["budget_w"] == 13


def test_jobs_per_client_total_jobs_and_message_rate_are_capped(limited_board):
    board = limited_board
    c1, c2 = Raw(board.endpoint), Raw(board.endpoint)
    try:
        ok = [c1.call(p.Register(budget_w=12, workload=f"w{i}")) for i in range(2)]
        assert all(isinstance(r, p.JobState) for r in ok)
        third = c1.call(p.Register(budget_w=12, workload="w3"))
        assert isinstance(third, p.Error) and "max_jobs_per_client" in third.message
        assert isinstance(c2.call(p.Register(budget_w=12, workload="w4")), p.JobState)
        full = c2.call(p.Register(budget_w=12, workload="w5"))
        assert isinstance(full, p.Error) and "max_jobs" in full.message
        # a flood from one connection is refused, and does not starve another connection
        for _ in range(300):
            c1.s.send(p.encode(p.Status()))
        replies = []
        while c1.s.poll(1000):
            replies.append(p.decode_reply(c1.s.recv()))
            if len(replies) == 300:
                break
        limited = [r for r in replies if isinstance(r, p.Error)]
        assert len(replies) == 300 and len(limited) >= 150
        assert "max_messages_per_s" in limited[0].message
        assert isinstance(c2.call(p.Status()), p.StatusReply)
    finally:
        c1.close()
        c2.close()


# ---- workload memory (#10 item 12) ----------------------------------------------------


def test_workloads_are_evicted_lru_and_reloaded_from_the_store(nano_trace):
    cfg = {"state": {"workloads_in_memory": 1}, **SLOW_OK}
    with EmulatedBoard("orin-nano", nano_trace, time_scale=TS, config=cfg) as board:
        for name in ("lru-a", "lru-b"):
            with powerd.request(budget_w=12, workload=name, endpoint=board.endpoint) as job:
                st = Stepper(board, job)
                try:
                    wait_for(lambda j=job: j.phase == "tuned", 60, f"{name} tuned", board)
                finally:
                    st.stop()
        wait_for(lambda: board.status()["jobs"] == [], 5, "jobs gone")
        s = board.status()
        assert s["workloads_in_memory"] == ["lru-b"]
        assert {"lru-a", "lru-b"} <= set(s["workloads"])
        f = next(board.state_dir.glob("workloads/*/lru-a/samples.json"))
        n = len(json.loads(f.read_text())["samples"])
        # lru-a comes back from the store: no profiling again
        with powerd.request(budget_w=12, workload="lru-a", endpoint=board.endpoint) as job:
            st = Stepper(board, job)
            try:
                phases = set()
                deadline = time.monotonic() + 30
                while job.phase != "tuned":
                    phases.add(job.phase)
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            finally:
                st.stop()
            assert "profiling" not in phases
        assert len(json.loads(f.read_text())["samples"]) == n
        assert "lru-a: evicted" in board.daemon_log.read_text()


# ---- frozen power sensor (#10 item 7) ----------------------------------------------------


def test_a_frozen_power_sensor_releases_the_job_and_gives_the_board_back(board):
    """Fails on the old daemon: it went on profiling with stale power."""
    with powerd.request(budget_w=12, workload="frozen", endpoint=board.endpoint) as job:
        st = Stepper(board, job)
        try:
            wait_for(lambda: job.phase == "profiling", 30, "profiling", board)
            time.sleep(0.3)
            board.emulator.freeze_power(True)
            wait_for(lambda: job.phase == "idle", 15, "the job told", board)
            assert "power sensor" in job.message or "power samples" in job.message
            wait_for(lambda: knob_snapshot(board.root) == board.baseline, 5, "baseline")
            s = board.status()
            assert s["power_sensor"] == "frozen"
            assert s["faults"][-1]["kind"] == "power_sensor_frozen"
            board.emulator.freeze_power(False)
            wait_for(lambda: job.phase != "idle", 15, "the job resumed", board)
            assert board.status()["power_sensor"] == "ok"
        finally:
            board.emulator.freeze_power(False)
            st.stop()
