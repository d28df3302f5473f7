"""Restore paths the daemon tests do not cover (#8 item 6, #10 item 14): `powerctl restore`
without a daemon, a restore that cannot write a value, and `powerd restore` while a daemon
holds the board but cannot answer (it must never write behind the daemon's back)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from waiting import wait_for

from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.trace import TRACE_DIR

TS = 0.03
MOBILENET = TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv"

JOB_SCRIPT = textwrap.dedent("""
    import sys
    from powerd.sim.job import run_training_job
    from powerd.sim.trace import Trace
    root, trace, endpoint, ts = sys.argv[1:5]
    run_training_job(root, Trace.load(trace), 20, "pinned", float(ts), endpoint=endpoint,
                     max_s=600, stay_tuned_s=600)
""")


@pytest.fixture
def board(trace):
    with EmulatedBoard("orin-agx", trace, time_scale=TS, strategy="binary-search") as b:
        b.baseline = knob_snapshot(b.root)
        yield b


def _pin_the_board(board):
    """A job process; returns once the daemon has pinned a mode for it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB_SCRIPT, str(board.root), str(MOBILENET), board.endpoint, str(TS)]
    )
    wait_for(lambda: knob_snapshot(board.root) != board.baseline, 60, "a pinned mode")
    return proc


def _run(*args, env=None):
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from powerd.cli import daemon_main, ctl_main; "
            "sys.exit((ctl_main if sys.argv[1] == 'ctl' else daemon_main)(sys.argv[2:]))",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, **(env or {})),
    )


def test_powerctl_restore_without_a_daemon(board):
    proc = _pin_the_board(board)
    try:
        board.stop_daemon(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert knob_snapshot(board.root) != board.baseline
    res = _run("ctl", "--config", str(board.config_path), "restore")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no daemon answered" in res.stderr and "baseline restored" in res.stdout
    assert knob_snapshot(board.root) == board.baseline
    assert not (board.state_dir / "baseline.json").exists()


@pytest.mark.parametrize("tool", ["powerd", "powerctl"])
def test_a_restore_that_cannot_write_names_the_file_and_exits_non_zero(board, tool):
    proc = _pin_the_board(board)
    try:
        board.stop_daemon(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    emc_lock = board.root / "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked"
    emc_lock.unlink()
    emc_lock.mkdir()  # writes to it fail now (EISDIR), like a kernel that refuses them
    cmd = ("ctl", "--config", str(board.config_path), "restore")
    if tool == "powerd":
        cmd = ("daemon", "restore", "--config", str(board.config_path))
    res = _run(*cmd)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "NOT fully restored" in res.stdout
    assert "/sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked" in res.stdout
    assert "Is a directory" in res.stdout
    assert (board.state_dir / "baseline.json").exists()  # kept for another try
    # everything else did come back
    rest = {k: v for k, v in knob_snapshot(board.root).items() if "clk/emc" not in k}
    assert rest == {k: v for k, v in board.baseline.items() if "clk/emc" not in k}


def test_powerd_restore_never_writes_behind_a_busy_daemon(board):
    proc = _pin_the_board(board)
    try:
        board.daemon.send_signal(signal.SIGSTOP)  # alive, holds the board, cannot answer
        try:
            time.sleep(0.5)  # the emulator judges the daemon's last writes asynchronously
            pinned = knob_snapshot(board.root)
            board.emulator.clear_logs()
            res = _run("daemon", "restore", "--config", str(board.config_path), "--wait", "2")
            assert res.returncode == 1, res.stdout + res.stderr
            assert "NOT writing sysfs behind its back" in res.stderr
            assert f"pid {board.daemon.pid}" in res.stderr
            assert board.emulator.seen_writes == []
            assert knob_snapshot(board.root) == pinned
        finally:
            board.daemon.send_signal(signal.SIGCONT)
        # awake again: the same command asks the daemon, which releases the job and restores
        res = _run("daemon", "restore", "--config", str(board.config_path))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "asking it to restore" in res.stderr and "job(s) released" in res.stdout
        assert knob_snapshot(board.root) == board.baseline
    finally:
        proc.kill()
        proc.wait()


def test_a_second_daemon_cannot_take_a_held_board(board):
    """The board lock: one writer. A second `powerd serve` on the same state dir refuses."""
    res = subprocess.run(
        [sys.executable, "-m", "powerd.cli", "serve", "--config", str(board.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert f"pid {board.daemon.pid}" in res.stderr and "holds the board lock" in res.stderr


def test_torn_baseline_after_a_crash_the_daemon_gives_the_board_back(board, trace):
    """#10 item 1 through the real daemon: kill -9 while a mode is pinned, the baseline file
    torn (power cut mid-write). The restarted daemon sets it aside, returns the board to the
    nvpmodel mode in force, keeps serving, and a later job's end restores that state."""
    from powerd.sim.job import run_training_job

    proc = _pin_the_board(board)
    try:
        board.stop_daemon(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    (board.state_dir / "baseline.json").write_text('{"version": 1, "online": [{"pa')
    board.start_daemon()
    log = board.daemon_log.read_text()
    assert "is corrupt" in log and "baseline.json.corrupt-" in log
    assert "known-good state (nvpmodel mode 0 (MAXN)) restored" in log
    assert knob_snapshot(board.root) == board.baseline  # MAXN is the tree's boot state
    run = run_training_job(
        board.root, trace, 25, "after-tear", TS, endpoint=board.endpoint, max_s=120
    )
    assert run.final_phase == "tuned", board.log_tail()
    wait_for(lambda: knob_snapshot(board.root) == board.baseline, 5, "baseline after the job")
