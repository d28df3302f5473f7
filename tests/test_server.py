"""The daemon end to end: real `powerd serve` process, emulated board, public client."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import zmq

import powerd
from powerd import protocol as p
from powerd.client import call_once
from powerd.endpoints import admin_endpoint
from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.job import run_training_job
from powerd.sim.trace import TRACE_DIR

TS = 0.03  # emulated step times are 3% of the trace's
MOBILENET = TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv"


@pytest.fixture
def board(trace):
    with EmulatedBoard("orin-agx", trace, time_scale=TS, strategy="binary-search") as b:
        b.baseline = knob_snapshot(b.root)
        yield b


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_status_json_has_the_contract_keys(board):
    res = subprocess.run(
        [sys.executable, "-m", "powerd.cli", "--help"], capture_output=True, text=True
    )
    assert res.returncode == 0
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from powerd.cli import ctl_main; import sys; sys.exit(ctl_main())",
            "status",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, POWERD_ENDPOINT=board.endpoint),
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    for key in ("board", "mode", "power_w", "budget_w", "jobs"):
        assert key in s
    assert "Orin" in s["board"]
    assert s["jobs"] == [] and s["mode"] is None
    assert 5 < s["power_w"] < 80  # the emulator's rails, summed


def test_training_job_gets_a_budget_safe_mode_and_the_board_is_restored(board, trace):
    run = run_training_job(
        board.root, trace, 25, "mobilenet", TS, endpoint=board.endpoint, max_s=120
    )
    assert run.final_phase == "tuned", board.log_tail()
    row = trace.lookup(run.final_mode)
    assert row.power_w <= 25.5
    best = trace.best_under(25)
    assert row.time_ms <= best.time_ms * 1.25  # a sane pick, not just a safe one
    # the job closed: the board goes back to the admin's baseline
    wait_for(lambda: knob_snapshot(board.root) == board.baseline, 5, "baseline restore")
    assert board.status()["jobs"] == []


def test_same_workload_again_skips_profiling(board, trace):
    run_training_job(board.root, trace, 22, "again", TS, endpoint=board.endpoint, max_s=120)
    samples_file = next(board.state_dir.glob("workloads/*/again/samples.json"))
    n = len(json.loads(samples_file.read_text())["samples"])
    run = run_training_job(board.root, trace, 22, "again", TS, endpoint=board.endpoint, max_s=60)
    assert run.final_phase == "tuned"
    assert len(json.loads(samples_file.read_text())["samples"]) == n
    assert "profiling" not in [ph for _, ph in run.phases[1:]]


def test_budget_outside_limits_is_rejected_with_the_limits(board):
    with pytest.raises(powerd.BudgetRejected) as exc:
        powerd.request(budget_w=500, endpoint=board.endpoint)
    assert "[5, 80]" in str(exc.value) and exc.value.max_w == 80
    with powerd.request(budget_w=30, workload="w", endpoint=board.endpoint) as job:
        with pytest.raises(powerd.BudgetRejected):
            job.set_budget(1)
        assert job.budget_w == 30
    assert board.status()["jobs"] == []


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        (dict(kind="inference", rate_hz=10, step_time_ms=100), "step_time_ms is for training"),
        (dict(kind="inference", rate_hz=10, expected_steps=100), "expected_steps is for train"),
        (dict(rate_hz=30), "rate_hz is for inference jobs only"),
        (dict(latency_ms=50, batch_sizes=(1, 4)), "latency_ms, batch_sizes are for inference"),
    ],
)
def test_a_field_of_the_other_kind_of_job_is_refused_not_ignored(board, kw, said):
    # the client says so before sending (InvalidArgument, a ValueError) ...
    with pytest.raises(powerd.InvalidArgument, match=said):
        powerd.request(budget_w=30, endpoint=board.endpoint, **kw)
    # ... and the daemon refuses such a message from any other client
    raw = {"v": 1, "type": "register", "id": 1, "kind": "training", "budget_w": 30, **kw}
    raw["batch_sizes"] = list(raw.get("batch_sizes") or []) or None
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(board.endpoint)
        sock.send(json.dumps(raw).encode())
        assert sock.poll(3000)
        reply = p.decode_reply(sock.recv())
    finally:
        sock.close()
    assert isinstance(reply, p.Error) and reply.code == "bad_request", reply
    assert said in reply.message
    assert board.status()["jobs"] == []


def test_set_budget_never_shows_a_stale_tuned_and_reuses_samples(board, trace):
    with powerd.request(budget_w=30, workload="rebudget", endpoint=board.endpoint) as job:
        stepper = _Stepper(board, trace, job)
        stepper.start()
        try:
            wait_for(lambda: job.phase == "tuned", 120, "first decision")
            first = len(_samples(board, "rebudget"))
            job.set_budget(20)
            assert job.phase != "tuned"
            assert job.budget_w == 20
            wait_for(lambda: job.phase == "tuned", 120, "second decision")
            assert trace.lookup(job.mode).power_w <= 20.5
            assert len(_samples(board, "rebudget")) - first < first  # reuse, not a rerun
        finally:
            stepper.stop()


def test_malformed_messages_get_errors_and_the_daemon_keeps_serving(board):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(board.endpoint)
    try:
        for raw in (
            b"garbage",
            b'{"v": 1, "type": "register", "budget_w": "x"}',
            b'{"v": 7, "type": "status"}',
            b'{"v": 1, "type": "steps", "job": "nope"}',
            b'{"v": 1, "type": "restore"}',
        ):
            sock.send(raw)
            assert sock.poll(3000), f"no answer to {raw!r}"
            reply = p.decode_reply(sock.recv())
            assert isinstance(reply, p.Error), raw
        sock.send_multipart([b"two", b"frames"])  # not our framing: dropped, no crash
    finally:
        sock.close()
    assert board.status()["board"]


def test_admin_commands_need_the_admin_socket(board):
    with pytest.raises(powerd.RequestFailed) as exc:
        call_once(board.endpoint, p.SetDefaultBudget(budget_w=20))
    assert exc.value.code == "forbidden"
    reply = call_once(admin_endpoint(board.endpoint), p.SetDefaultBudget(budget_w=20))
    assert isinstance(reply, p.Ok)
    assert board.status()["default_budget_w"] == 20


JOB_SCRIPT = textwrap.dedent("""
    import sys, time
    from powerd.sim.job import run_training_job
    from powerd.sim.trace import Trace
    root, trace, endpoint, ts = sys.argv[1:5]
    run_training_job(root, Trace.load(trace), 20, "killed", float(ts), endpoint=endpoint,
                     max_s=600, stay_tuned_s=600)
""")


def _start_job_process(board):
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            JOB_SCRIPT,
            str(board.root),
            str(MOBILENET),
            board.endpoint,
            str(TS),
        ],
    )


def _wait_profiling(board):
    def profiling():
        jobs = board.status()["jobs"]
        return bool(jobs) and jobs[0]["phase"] == "profiling" and jobs[0]["profiled_modes"] >= 1

    wait_for(profiling, 60, "profiling to start")
    assert knob_snapshot(board.root) != board.baseline


def test_client_killed_mid_profile_restores_baseline(board):
    proc = _start_job_process(board)
    try:
        _wait_profiling(board)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        timeout = board.config.server.heartbeat_timeout_ms / 1000
        wait_for(
            lambda: knob_snapshot(board.root) == board.baseline,
            timeout + 3,
            "baseline after the client died",
        )
        assert time.monotonic() - t0 <= timeout + 3
        assert board.status()["jobs"] == []
    finally:
        proc.kill()


def test_sigterm_mid_profile_restores_baseline(board):
    proc = _start_job_process(board)
    try:
        _wait_profiling(board)
        assert board.stop_daemon(signal.SIGTERM) == 0
        assert knob_snapshot(board.root) == board.baseline
    finally:
        proc.kill()


def test_crash_mid_profile_is_recovered_at_start_and_by_powerd_restore(board):
    proc = _start_job_process(board)
    try:
        _wait_profiling(board)
        board.stop_daemon(signal.SIGKILL)
        assert knob_snapshot(board.root) != board.baseline
        assert (board.state_dir / "baseline.json").exists()
        res = subprocess.run(
            [sys.executable, "-m", "powerd.cli", "restore", "--config", str(board.config_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert knob_snapshot(board.root) == board.baseline
    finally:
        proc.kill()


def test_restart_after_crash_restores_the_saved_baseline(board):
    proc = _start_job_process(board)
    try:
        _wait_profiling(board)
        board.stop_daemon(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    board.start_daemon()
    assert knob_snapshot(board.root) == board.baseline


def test_a_second_workload_waits_its_turn(board, trace):
    with powerd.request(budget_w=30, workload="first", endpoint=board.endpoint) as a:
        sa = _Stepper(board, trace, a)
        sa.start()
        try:
            wait_for(lambda: a.phase == "profiling", 30, "first job profiling")
            with powerd.request(budget_w=30, workload="second", endpoint=board.endpoint) as b:
                sb = _Stepper(board, trace, b)
                sb.start()
                try:
                    wait_for(lambda: b.phase in ("queued", "profiling"), 5, "second registered")
                    if a.phase == "profiling":
                        assert b.phase == "queued"
                    wait_for(lambda: a.phase == "tuned" and b.phase == "tuned", 120, "both tuned")
                finally:
                    sb.stop()
        finally:
            sa.stop()


def test_no_daemon_raises_within_2s_or_runs_noop(tmp_path):
    ep = f"ipc://{tmp_path}/none.sock"
    t0 = time.monotonic()
    with pytest.raises(powerd.DaemonUnavailable) as exc:
        powerd.request(budget_w=20, endpoint=ep)
    assert time.monotonic() - t0 < 2
    assert "required=False" in str(exc.value)
    # a socket file nobody serves: still within 2 s
    (tmp_path / "stale.sock").touch()
    t0 = time.monotonic()
    with pytest.raises(powerd.DaemonUnavailable):
        powerd.request(budget_w=20, endpoint=f"ipc://{tmp_path}/stale.sock")
    assert time.monotonic() - t0 < 2
    with pytest.warns(RuntimeWarning):
        job = powerd.request(budget_w=20, endpoint=ep, required=False)
    job.step()
    assert job.phase == "idle" and job.mode is None


# ---- helpers ------------------------------------------------------------------------------


class _Stepper:
    """Steps a job from a thread with the trace's (scaled) step times."""

    def __init__(self, board, trace, job):
        import threading

        from powerd.sim.emulator import read_effective_mode

        self._read = read_effective_mode
        self.board, self.trace, self.job = board, trace, job
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._t.start()

    def stop(self):
        self._stop.set()
        self._t.join()

    def _run(self):
        while not self._stop.is_set():
            mode = self._read(self.board.root)
            time.sleep(self.trace.lookup(mode).time_ms / 1000 * TS)
            self.job.step()


def _samples(board, workload):
    f = next(board.state_dir.glob(f"workloads/*/{workload}/samples.json"))
    return json.loads(f.read_text())["samples"]
