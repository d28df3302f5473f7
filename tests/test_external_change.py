"""Coexisting with nvpmodel / jetson_clocks / jtop (#8 item 8) and the daemon's side of the
restore paths (#8 item 6): through the real daemon on an emulated board.

Another tool is played by writing a pinned GPU devfreq window behind the daemon's back, the
way `nvpmodel -m` does (it writes max_freq and min_freq). `[device] on_external_change`
says what powerd does then: "reapply" writes its mode again, "yield" gives the board up
until the next register or set_budget.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

import powerd
from powerd.modes import PowerMode
from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.trace import Trace

TS = 0.03


def _board(trace: Trace, policy: str) -> EmulatedBoard:
    return EmulatedBoard(
        "orin-agx",
        trace,
        time_scale=TS,
        strategy="binary-search",
        config={"device": {"on_external_change": policy}},
    )


@pytest.fixture
def reapply_board(trace: Trace) -> Iterator[EmulatedBoard]:
    with _board(trace, "reapply") as b:
        b.baseline = knob_snapshot(b.root)  # type: ignore[attr-defined]
        yield b


@pytest.fixture
def yield_board(trace: Trace) -> Iterator[EmulatedBoard]:
    with _board(trace, "yield") as b:
        b.baseline = knob_snapshot(b.root)  # type: ignore[attr-defined]
        yield b


class Stepper(threading.Thread):
    def __init__(self, job: powerd.Job):
        super().__init__(daemon=True)
        self.job = job
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.job.step()
            time.sleep(0.004)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(5)


def _tuned_job(board: EmulatedBoard, workload: str) -> tuple[powerd.Job, Stepper]:
    job = powerd.request(budget_w=33, workload=workload, endpoint=board.endpoint)
    assert isinstance(job, powerd.Job)
    stepper = Stepper(job)
    stepper.start()
    wait_for(lambda: job.phase == "tuned" and job.mode is not None, 90, "a tuned mode", board)
    return job, stepper


def _gpu_window(board: EmulatedBoard, gpu_hz: int) -> Path:
    """The GPU devfreq directory: the one whose window powerd pinned to the mode's clock."""
    for max_file in board.root.glob("sys/devices/**/devfreq/*/max_freq"):
        d = max_file.parent
        if d.is_symlink() or max_file.is_symlink():
            continue
        if (d / "min_freq").read_text().strip() == max_file.read_text().strip() == str(gpu_hz):
            return d
    raise AssertionError("no devfreq window pinned to the GPU clock")


def _pinned_gpu(board: EmulatedBoard, job: powerd.Job) -> tuple[PowerMode, Path, str]:
    """The tuned job's mode, its GPU devfreq directory, and that directory as
    knob_snapshot names it."""
    mode = job.mode
    assert mode is not None
    gpu = _gpu_window(board, mode.gpu_hz)
    return mode, gpu, "sys/" + str(gpu.relative_to(board.root / "sys"))


def _other_tool_writes(gpu: Path, pinned_hz: int) -> int:
    """What `nvpmodel -m N` does to the GPU: a new window, written in the order devfreq
    accepts (it refuses min > max)."""
    freqs = [int(f) for f in (gpu / "available_frequencies").read_text().split()]
    other = next(f for f in sorted(freqs) if f != pinned_hz)
    order = ("min_freq", "max_freq") if other < pinned_hz else ("max_freq", "min_freq")
    for name in order:
        (gpu / name).write_text(f"{other}\n")
    return other


def _external_faults(board: EmulatedBoard) -> list[dict]:
    return [f for f in board.status()["faults"] if f["kind"] == "external_change"]


def test_reapply_puts_the_pinned_mode_back_and_logs_what_changed(
    reapply_board: EmulatedBoard,
) -> None:
    board = reapply_board
    job, stepper = _tuned_job(board, "reapplied")
    try:
        mode = job.mode
        assert mode is not None
        gpu = _gpu_window(board, mode.gpu_hz)
        other = _other_tool_writes(gpu, mode.gpu_hz)
        wait_for(lambda: _external_faults(board), 5, "the change to be seen", board)
        rel = "/" + str(gpu.relative_to(board.root))
        both = {f"{rel}/max_freq", f"{rel}/min_freq"}
        # the two writes may fall into one check or two
        wait_for(
            lambda: both <= {c["file"] for f in _external_faults(board) for c in f["changes"]},
            5,
            "both changed files to be reported",
            board,
        )
        faults = _external_faults(board)
        assert {f["action"] for f in faults} == {"reapplied"}
        changes = [c for f in faults for c in f["changes"]]
        assert {c["file"] for c in changes} == both
        assert {c["expected"] for c in changes} == {str(mode.gpu_hz)}
        assert {c["found"] for c in changes} == {str(other)}
        assert "unknown process" in faults[0]["message"]  # sysfs cannot say who wrote it
        wait_for(
            lambda: (
                (gpu / "max_freq").read_text().strip() == str(mode.gpu_hz)
                and (gpu / "min_freq").read_text().strip() == str(mode.gpu_hz)
            ),
            5,
            "the pinned GPU window to be written again",
            board,
        )
        log = board.daemon_log.read_text()
        assert "writing mode" in log and f"{rel}/max_freq: powerd pinned" in log
        time.sleep(0.5)
        assert job.phase == "tuned" and job.mode == mode  # it went on as before
        assert board.status()["jobs"][0]["phase"] == "tuned"
    finally:
        stepper.stop()
    job.close()
    wait_for(lambda: knob_snapshot(board.root) == board.baseline, 10, "the baseline", board)  # type: ignore[attr-defined]


def test_reapply_backs_off_from_a_tool_that_keeps_rewriting(
    reapply_board: EmulatedBoard,
) -> None:
    """A tool that rewrites the GPU window again as soon as powerd has put it back: powerd
    keeps taking the board back, checking less and less often, as one fault entry and a
    few log lines rather than one of each every 0.5 s."""
    board = reapply_board
    job, stepper = _tuned_job(board, "fought")
    try:
        mode = job.mode
        assert mode is not None
        gpu = _gpu_window(board, mode.gpu_hz)
        pinned = str(mode.gpu_hz)
        waits = []
        for _ in range(4):
            _other_tool_writes(gpu, mode.gpu_hz)
            t0 = time.monotonic()
            wait_for(
                lambda: (
                    (gpu / "max_freq").read_text().strip() == pinned
                    and (gpu / "min_freq").read_text().strip() == pinned
                ),
                30,
                "the pinned GPU window to be written again",
                board,
            )
            waits.append(time.monotonic() - t0)
            time.sleep(0.3)  # past powerd's read-back of its own write
        (fault,) = _external_faults(board)  # one fight, one entry
        assert fault["rounds"] == 4, fault
        # the check period doubles each round (0.5, 1, 2, 4 s): the rewrite stood longer
        assert waits[-1] > 2 * waits[0] and waits[-1] > 1.5, waits
        log = board.daemon_log.read_text()
        assert log.count("writing mode") == 1
        assert "(round 2" in log and "(round 4" in log and "(round 3" not in log
        assert job.phase == "tuned" and job.mode == mode
    finally:
        stepper.stop()
    job.close()


def test_yield_releases_the_board_and_takes_it_again_on_the_next_request(
    yield_board: EmulatedBoard,
) -> None:
    board = yield_board
    job, stepper = _tuned_job(board, "yielded")
    try:
        mode, gpu, rel = _pinned_gpu(board, job)
        other = _other_tool_writes(gpu, mode.gpu_hz)
        wait_for(lambda: job.phase == "idle", 5, "the job to read idle", board)
        assert "gave the board up" in job.message and "max_freq" in job.message
        (fault,) = _external_faults(board)
        assert fault["action"] == "yielded" and fault["active"] is True
        status = board.status()
        assert status["mode"] is None and status["jobs"][0]["phase"] == "idle"
        # the other tool's values stay; every other knob is back at the baseline
        snap = knob_snapshot(board.root)
        assert snap[f"{rel}/max_freq"] == snap[f"{rel}/min_freq"] == str(other)
        assert {k: v for k, v in snap.items() if not k.startswith(rel)} == {
            k: v
            for k, v in board.baseline.items()  # type: ignore[attr-defined]
            if not k.startswith(rel)
        }
        human = _powerctl(board, "status").stdout
        assert "yielded   another tool changed values powerd had pinned" in human
        time.sleep(1.0)  # steps go on: powerd does not take the board back by itself
        assert job.phase == "idle" and job.mode is None
        assert (gpu / "max_freq").read_text().strip() == str(other)

        job.set_budget(32)  # the next request: powerd drives the board again
        wait_for(lambda: job.mode is not None, 60, "a mode after the next request", board)
        (fault,) = _external_faults(board)
        assert fault["active"] is False
    finally:
        stepper.stop()
    job.close()
    # the fresh baseline saved after the yield holds the other tool's GPU window
    want = dict(board.baseline)  # type: ignore[attr-defined]
    want[f"{rel}/max_freq"] = want[f"{rel}/min_freq"] = str(other)
    wait_for(lambda: knob_snapshot(board.root) == want, 10, "the other tool's state", board)


def test_status_shows_jtop_nvpmodel_and_baseline(reapply_board: EmulatedBoard) -> None:
    board = reapply_board
    st = board.status()
    assert st["jetson_stats"]["service"] == "absent"
    assert st["baseline"]["pending"] is False and st["baseline"]["restore_problem"] is None
    assert st["baseline"]["nvpmodel"]["id"] == 0
    unit = board.root / "etc/systemd/system/jtop.service"
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text("[Service]\nExecStart=/usr/local/bin/jtop --force\n")
    (board.root / "run").mkdir(exist_ok=True)
    (board.root / "run/jtop.sock").touch()
    time.sleep(2.1)  # status re-reads jetson-stats' state every 2 s
    res = _powerctl(board, "status")
    assert res.returncode == 0, res.stderr
    assert "jtop      service running (/run/jtop.sock)" in res.stdout
    assert "nvpmodel  mode 0 (MAXN)" in res.stdout
    assert "RESTORE FAILED" not in res.stdout


def _powerctl(board: EmulatedBoard, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from powerd.cli import ctl_main; sys.exit(ctl_main(sys.argv[1:]))",
            "--config",
            str(board.config_path),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "POWERD_ENDPOINT"},
    )


def test_an_admin_restore_that_fails_says_so_and_a_live_client_stays_released(
    reapply_board: EmulatedBoard,
) -> None:
    board = reapply_board
    job, stepper = _tuned_job(board, "released")
    try:
        emc_lock = board.root / "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked"
        emc_lock.unlink()
        emc_lock.mkdir()  # writes to it fail now (EISDIR), like a kernel that refuses them
        res = _powerctl(board, "restore")
        assert res.returncode == 1, res.stdout + res.stderr
        assert "restore_failed" in res.stderr and "1 job(s) released" in res.stderr
        assert "/sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked" in res.stderr
        assert "Is a directory" in res.stderr
        st = board.status()
        assert "mrq_rate_locked" in (st["baseline"]["restore_problem"] or "")
        assert st["baseline"]["pending"] is True
        human = _powerctl(board, "status").stdout
        assert "RESTORE FAILED" in human and "mrq_rate_locked" in human

        # the client learns its job was released on purpose: it does not register again
        wait_for(lambda: job.phase == "idle", 5, "the job to read idle", board)
        time.sleep(2.0)  # several heartbeats
        assert board.status()["jobs"] == []

        # the kernel takes writes again: the idle retry (2 s back-off) finishes the restore
        emc_lock.rmdir()
        emc_lock.write_text("1\n")
        wait_for(
            lambda: board.status()["baseline"]["restore_problem"] is None,
            10,
            "the idle retry to restore the board",
            board,
        )
        assert knob_snapshot(board.root) == board.baseline  # type: ignore[attr-defined]
        assert board.status()["jobs"] == []
    finally:
        stepper.stop()
    job.close()


def test_yield_puts_back_the_half_of_a_window_the_other_tool_left(
    yield_board: EmulatedBoard,
) -> None:
    """A tool that raises only the GPU's max_freq (powerd had pinned min = max): the
    min_freq it never touched goes back to the baseline, not left at powerd's pin (and
    then saved as the admin's baseline at the next request). Fails on the old code."""
    board = yield_board
    job, stepper = _tuned_job(board, "half")
    try:
        mode, gpu, rel = _pinned_gpu(board, job)
        top = max(int(f) for f in (gpu / "available_frequencies").read_text().split())
        assert top > mode.gpu_hz
        (gpu / "max_freq").write_text(f"{top}\n")  # only max: like raising a cap
        wait_for(lambda: job.phase == "idle", 5, "the job to read idle", board)
        want = dict(board.baseline)  # type: ignore[attr-defined]
        want[f"{rel}/max_freq"] = str(top)
        wait_for(lambda: knob_snapshot(board.root) == want, 5, "the rest of the baseline", board)
        job.set_budget(32)  # powerd takes the board again, saving a fresh baseline
        wait_for(lambda: job.mode is not None, 60, "a mode after the next request", board)
    finally:
        stepper.stop()
    job.close()
    # the fresh baseline: the tool's max, and the admin's min (not powerd's old pin)
    wait_for(lambda: knob_snapshot(board.root) == want, 10, "the baseline with the tool's max")


def test_after_an_admin_restore_the_job_says_why_and_set_budget_raises_released(
    reapply_board: EmulatedBoard, caplog: pytest.LogCaptureFixture
) -> None:
    """Fails on the old client: the job read idle with an empty message, and set_budget
    blamed the daemon ("lost this job ... start it with sudo systemctl start powerd")."""
    caplog.set_level(logging.WARNING, logger="powerd.client")
    board = reapply_board
    job, stepper = _tuned_job(board, "restored")
    try:
        res = _powerctl(board, "restore")
        assert res.returncode == 0, res.stdout + res.stderr
        wait_for(lambda: job.phase == "idle", 5, "the job to read idle", board)
        wait_for(lambda: "admin's restore" in job.message, 5, "the reason", board)
        # unmanaged: nothing decided for it (it read True while released, on the old client)
        assert job.feasible is None
        with pytest.raises(powerd.JobReleased, match="admin's restore"):
            job.set_budget(30)
        said = [r.getMessage() for r in caplog.records if "admin's restore" in r.getMessage()]
        assert said and not any("unknown_job" in m for m in said), said  # no protocol code
        assert board.status()["jobs"] == []  # not registered again behind the admin's back
        assert knob_snapshot(board.root) == board.baseline  # type: ignore[attr-defined]
    finally:
        stepper.stop()
        job.close()
