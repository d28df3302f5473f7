"""A new user's first hour: the demo's serve mode, powerctl output, the pareto plot, and
what `powerctl status` says about an idle board."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import powerd
from powerd import protocol as p
from powerd.sim.emulator import idle_power_w
from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.trace import Trace

TS = 0.03
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def board(trace: Trace) -> Iterator[EmulatedBoard]:
    with EmulatedBoard("orin-agx", trace, time_scale=TS, strategy="binary-search") as b:
        yield b


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ---- powerctl status on an idle board -----------------------------------------------------


def test_status_on_an_idle_board_reports_idle_power_after_a_job(
    board: EmulatedBoard, trace: Trace
) -> None:
    # Halfway between the idle draw and the lowest busy power: a reading's 1 % noise can put
    # the lowest-power mode under its own traced value, never under this.
    lowest_busy = min(r.power_w for r in trace.rows)
    split = (idle_power_w(trace) + lowest_busy) / 2
    assert board.status()["power_w"] < split  # idle from the start
    baseline = knob_snapshot(board.root)
    with powerd.request(budget_w=40, workload="busy", endpoint=board.endpoint) as job:
        deadline = time.monotonic() + 20
        while job.mode is None and time.monotonic() < deadline:
            job.step()
            time.sleep(0.01)
        assert job.mode is not None
        time.sleep(0.3)
        busy = board.status()["power_w"]
        assert busy > split  # the job's load shows while powerd holds the board
    deadline = time.monotonic() + 10
    while knob_snapshot(board.root) != baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a few settling time constants and sampling periods
    idle = board.status()["power_w"]
    assert idle < split, f"status still shows {idle} W on an idle board (busy {busy} W)"


# ---- powerctl ... | head -------------------------------------------------------------------


def test_powerctl_into_a_closed_pipe_exits_quietly(board: EmulatedBoard) -> None:
    r, w = os.pipe()
    os.close(r)  # the reader (`head`) is already gone when powerctl writes
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from powerd.cli import ctl_main; sys.exit(ctl_main())",
                "status",
                "--json",
            ],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(POWERD_ENDPOINT=board.endpoint),
            timeout=30,
        )
    finally:
        os.close(w)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.stderr == ""
    assert proc.returncode == 141


# ---- the pareto plot ----------------------------------------------------------------------


def _reply(times: list[float], powers: list[float], extra: dict | None = None) -> p.Predictions:
    rows = [
        {
            "cores": 12,
            "cpu_khz": 2201600,
            "gpu_hz": 1300500000 - i,
            "emc_hz": 3199000000,
            "time_ms": t,
            "power_w": w,
        }
        for i, (t, w) in enumerate(zip(times, powers, strict=True))
    ]
    return p.Predictions(workload="w", rows=rows, extra=extra or {})


def _tick_labels(fig) -> list[str]:  # noqa: ANN001
    fig.canvas.draw()
    ax = fig.axes[0]
    return [t.get_text() for t in ax.get_yticklabels(which="both") if t.get_text()]


@pytest.mark.parametrize(
    "times",
    [
        [0.95, 0.85, 0.8, 0.7, 0.6, 0.55],  # under one decade: the old axis printed 8x10^-1
        [900.0, 300.0, 80.0, 20.0, 6.0],  # over two decades: log axis
    ],
)
def test_pareto_plot_has_plain_ms_ticks_a_budget_line_and_a_pick(tmp_path, times) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.lines import Line2D

    from powerd.plot import pareto_figure, plot_pareto

    powers = [10.0, 14.0, 18.0, 24.0, 30.0, 36.0][: len(times)]
    reply = _reply(times, powers)
    fig = pareto_figure(reply, budget_w=20.0)
    labels = _tick_labels(fig)
    assert len(labels) >= 2
    for text in labels:
        assert re.fullmatch(r"\d+(\.\d+)?", text), f"tick label {text!r} is not plain ms"
    ax = fig.axes[0]
    vlines = [
        ln for ln in ax.get_lines() if isinstance(ln, Line2D) and list(ln.get_xdata()) == [20, 20]
    ]
    assert vlines, "no budget line at 20 W"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("budget 20 W") for t in legend)
    # the pick: the fastest front mode within 20 W
    pick = [t for t in legend if t.startswith("predicted pick within the budget")]
    want = min(t for t, w in zip(times, powers, strict=True) if w <= 20)
    assert pick and f"{want:.3g} ms at" in pick[0], legend
    out = tmp_path / "front.png"
    plot_pareto(reply, str(out), budget_w=20.0)
    assert out.stat().st_size > 1000


@pytest.mark.parametrize(
    "times",
    [
        [20.24, 20.13, 20.1, 20.09, 20.08],  # a flat front: 3 significant digits read 20.1
        [150.9, 150.6, 150.3, 150.1, 150.0],  # over 100 ms: whole ms read 150 or 151
    ],
)
def test_a_flat_front_has_tick_labels_that_tell_its_ticks_apart(times) -> None:
    pytest.importorskip("matplotlib")
    from powerd.plot import pareto_figure

    fig = pareto_figure(_reply(times, [10.0, 14.0, 18.0, 24.0, 30.0]), budget_w=20.0)
    labels = _tick_labels(fig)
    ticks = [t for t in fig.axes[0].get_yticks() if min(times) <= t <= max(times)]
    assert len(ticks) >= 3
    assert len(set(labels)) == len(labels), f"tick labels repeat: {labels}"
    for text in labels:
        assert re.fullmatch(r"\d+(\.\d+)?", text), f"tick label {text!r} is not plain ms"
    # each label is its tick's value, not a rounding of it
    shown = {round(float(t), 6) for t in labels}
    assert all(round(float(t), 6) in shown for t in ticks), (labels, ticks)


def test_tick_decimals_are_the_fewest_that_write_every_tick_exactly() -> None:
    from powerd.plot import tick_decimals

    assert tick_decimals([20.0, 20.05, 20.1]) == 2
    assert tick_decimals([100.0, 200.0, 300.0]) == 0
    assert tick_decimals([0.5, 1.0, 1.5]) == 1
    assert tick_decimals([20.08 + 1e-14, 20.1]) == 2  # float noise of a locator's ticks
    assert tick_decimals([1 / 3]) == 4  # no finite decimals: the most it writes


def test_pareto_plot_marks_the_daemons_pinned_mode_over_a_guess() -> None:
    pytest.importorskip("matplotlib")
    from powerd.plot import pareto_figure

    chosen = {"cores": 12, "cpu_khz": 1, "gpu_hz": 1, "emc_hz": 1, "time_ms": 0.9, "power_w": 12}
    reply = _reply([0.95, 0.8, 0.6], [10.0, 18.0, 30.0], {"budget_w": 25.0, "chosen": chosen})
    fig = pareto_figure(reply, budget_w=99.0)  # the reply's own budget wins
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "budget 25 W" in legend
    assert any(t.startswith("pinned mode (measured): 0.9 ms at 12.0 W") for t in legend)


def test_inference_front_plot_has_a_line_per_batch_size_and_the_target_lines() -> None:
    pytest.importorskip("matplotlib")
    from powerd.plot import inference_front_figure

    def row(b: int, lat: float, w: float, drains: bool = True) -> dict:
        return {"batch_size": b, "latency_ms": lat, "power_w": w, "drains": drains}

    rows = [row(1, 40, 12), row(1, 25, 16), row(4, 90, 11), row(4, 60, 14), row(16, 700, 10, False)]
    measured = [{"batch_size": 4, "batch_ms": 30.0, "batch_p99_ms": 33.0, "power_w": 13.0}]
    extra = {"kind": "inference", "rate_hz": 50.0, "profiled": measured}
    reply = p.Predictions(workload="w", rows=rows, extra=extra)
    fig = inference_front_figure(reply, budget_w=15.0, latency_ms=100.0)
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # a line per batch size whose queue drains; b=16 only as crosses (its queue grows)
    assert {"b=1", "b=4", "b=16"} <= set(legend)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["b=4"].get_ydata()) == [90, 60]  # sorted by power
    assert "b=16" not in lines
    assert "queue does not drain at this rate" in legend
    assert "budget 15 W" in legend and "latency 100 ms" in legend
    assert "measured pairs (1)" in legend
    # the measured pair sits at its worst case at 50/s: (4-1)/50 s + its p99 batch time
    pts = [c for c in ax.collections if c.get_label() == "measured pairs (1)"][0]
    assert pts.get_offsets().tolist() == [[13.0, 60.0 + 33.0]]


# ---- tools/demo --serve ---------------------------------------------------------------------


def test_demo_serve_prints_the_endpoint_and_restores_on_ctrl_c() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powerd.sim.demo",
            "--serve",
            "--strategy",
            "binary-search",
            "--time-scale",
            str(TS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        endpoint = None
        seen = []
        deadline = time.monotonic() + 30
        while endpoint is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
            m = re.search(r"export POWERD_ENDPOINT=(\S+)", line)
            if m:
                endpoint = m.group(1)
        assert endpoint is not None, "".join(seen)
        # one's own training script: the public API with the printed endpoint in the env
        script = (
            "import time, powerd\n"
            "job = powerd.request(budget_w=30, workload='mine')\n"
            "t = time.monotonic() + 20\n"
            "while job.mode is None and time.monotonic() < t:\n"
            "    job.step(); time.sleep(0.01)\n"
            "print(job.phase, job.mode)\n"
            # no close(): Ctrl-C on the daemon must still give the board back
            "import os; os._exit(0 if job.mode is not None else 1)\n"
        )
        res = subprocess.run(
            [sys.executable, "-c", script],
            env=_env(POWERD_ENDPOINT=endpoint),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert "board restored to its baseline: yes" in out, out
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- a user outside the socket group --------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
@pytest.mark.parametrize(
    "group, mode, words", [("adm", 0o660, "group 'adm'"), ("root", 0o600, "only root")]
)
def test_a_user_outside_the_socket_group_is_told_which_group(
    tmp_path: Path, group: str, mode: int, words: str
) -> None:
    import grp
    import pwd

    d = tmp_path / "run"
    d.mkdir()
    for parent in (d, *d.parents):
        if parent in (Path("/tmp"), Path("/")):
            break
        os.chmod(parent, 0o755)
    sock = d / "powerd.sock"
    sock.write_text("")  # the client checks access before it connects
    os.chown(sock, 0, grp.getgrnam(group).gr_gid)
    os.chmod(sock, mode)
    nobody = pwd.getpwnam("nobody")
    # a forked child drops to `nobody` (the interpreter's files may be root-only, so a fresh
    # process as nobody could not even start)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                powerd.request(budget_w=20, endpoint=f"ipc://{sock}")
            except powerd.DaemonUnavailable as exc:
                os.write(w, str(exc).encode())
                code = 3
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        message = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3, message
    assert words in message and str(sock) in message, message
    if group != "root":
        assert f"usermod -aG {group}" in message


def test_status_says_an_inference_queue_grows_rather_than_a_best_latency():
    from powerd.cli import _job_detail

    job = {
        "id": "j1",
        "workload": "flood",
        "phase": "tuned",
        "budget_w": 17.0,
        "kind": "inference",
        "batch_size": 16,
        "latency_ms": None,
        "rate_hz": 400.0,
        "feasible": False,
        "best_latency_ms": 91.5,
        "queue_grows": True,
        "pairs_profiled": 3,
        "message": "no pair under 17 W keeps up with 400 requests/s: serving the most, 49/s",
    }
    text = _job_detail(job)
    assert "INFEASIBLE (queue grows)" in text and "best 91" not in text
    job["queue_grows"], job["best_latency_ms"] = False, 415.0
    assert "INFEASIBLE (best 415" in _job_detail(job)
