"""PowerTrain through the real daemon: fit, predict, Pareto, persistence across restarts."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from powerd.predictor.reference import ReferenceModel
from powerd.sim.harness import EmulatedBoard
from powerd.sim.job import run_training_job
from powerd.store import Store

TS = 0.03


@pytest.fixture(scope="module")
def tuned_board(nano_trace):
    """An emulated Orin Nano whose daemon already tuned one workload with powertrain."""
    with EmulatedBoard("orin-nano", nano_trace, time_scale=TS, strategy="powertrain") as b:
        b.run = run_training_job(
            b.root, nano_trace, 12, "resnet", TS, endpoint=b.endpoint, max_s=180
        )
        yield b


def powerctl(board, *args):
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from powerd.cli import ctl_main; sys.exit(ctl_main())",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, POWERD_ENDPOINT=board.endpoint),
    )


def test_powertrain_pins_a_measured_budget_safe_mode(tuned_board, nano_trace):
    run = tuned_board.run
    assert run.final_phase == "tuned", tuned_board.log_tail()
    assert nano_trace.lookup(run.final_mode).power_w <= 12.5
    phases = [ph for _, ph in run.phases]
    assert "fitting" in phases  # it transferred the reference model before deciding
    # a job that does not say how long it runs is taken to run as long again as it has:
    # what it measures after its commit stays within refine_share (10 %) of its steps, each
    # measurement a window of at least min_steps (5)
    after = re.findall(r"measuring .* after the commit", tuned_board.daemon_log.read_text())
    assert len(after) <= 0.1 * run.steps / 5, (len(after), run.steps)


def test_a_long_job_keeps_measuring_after_its_first_commit(nano_trace):
    """request(expected_steps=N): after the first commit the daemon measures promising
    modes within the budget while the job trains, and ends on the fastest measured."""
    with EmulatedBoard("orin-nano", nano_trace, time_scale=TS, strategy="powertrain") as b:
        run = run_training_job(
            b.root,
            nano_trace,
            13,
            "long",
            TS,
            endpoint=b.endpoint,
            max_s=240,
            stay_tuned_s=1.5,
            expected_steps=200_000,
        )
        assert run.final_phase == "tuned", b.log_tail()
        log = b.daemon_log.read_text()
        # the job's length reached the strategy: it was asked what to measure after the
        # commit with room to spare, and measured until nothing more promised a gain
        # (whether anything did depends on how good the first commit was: the replay
        # tests in tests/optimize/test_powertrain_refine.py check that it does measure)
        done = re.search(
            r"nothing more to measure after the commit \((\d+) measured, room (\d+)", log
        )
        assert done is not None, b.log_tail()
        measured, room = int(done.group(1)), int(done.group(2))
        probes = re.findall(r"measuring .* after the commit", log)
        assert room > 0 and len(probes) == measured, b.log_tail()
        phases = [ph for _, ph in run.phases]
        if measured:
            assert "profiling" in phases[phases.index("tuned") :], phases  # measured, tuned
        samples = Store(b.state_dir).load_samples(b.status()["board_key"], "long")
        assert len(samples) <= 50
        pinned = samples[run.final_mode]
        assert pinned.power_w <= 13 and not pinned.aborted_over_budget, pinned
        fitting = [m for m in samples.values() if m.power_w <= 13 and not m.aborted_over_budget]
        fastest = min(fitting, key=lambda m: m.time_ms)
        assert pinned.time_ms == fastest.time_ms, (pinned, fastest, b.log_tail())
        assert nano_trace.lookup(run.final_mode).power_w <= 13.5


def test_status_says_which_fit_ran(tuned_board):
    log = tuned_board.daemon_log.read_text()
    assert "fitted resnet" in log and "with ridge" in log
    stored = next(tuned_board.state_dir.glob("workloads/*/resnet/model/fitted.json"))
    assert json.loads(stored.read_text())["method"] == "ridge"


def test_predict_json_covers_the_mode_space(tuned_board, nano_trace):
    res = powerctl(tuned_board, "predict", "--workload", "resnet", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert len(rows) == tuned_board.status()["mode_space_size"] == len(nano_trace)
    assert set(rows[0]) >= {"cores", "cpu_khz", "gpu_hz", "emc_hz", "time_ms", "power_w"}
    # the fitted model's own uncertainty per mode (additive to the contract's keys)
    bounds = {"time_ms_lo", "time_ms_hi", "power_w_lo", "power_w_hi"}
    assert set(rows[0]) - {"cores", "cpu_khz", "gpu_hz", "emc_hz", "time_ms", "power_w"} == bounds
    for r in rows:
        assert r["time_ms_lo"] < r["time_ms"] < r["time_ms_hi"]
        assert r["power_w_lo"] < r["power_w"] < r["power_w_hi"]
    # where it profiled (a 12 W budget: the low-power modes) the fit must be close; the
    # time predictions are of the emulated job's scaled step times
    near = [(r, nano_trace.lookup(_mode(r))) for r in rows]
    near = [(r, t) for r, t in near if t.power_w <= 14]
    p_err = np.mean([abs(r["power_w"] / t.power_w - 1) for r, t in near])
    assert len(near) > 20
    # the transfer must beat the reference model it started from (trained on Orin AGX)
    ref_t, ref_p = ReferenceModel.load().predict(np.array([_mode(r).as_tuple() for r, _ in near]))
    ref_p_err = np.mean([abs(pp / t.power_w - 1) for pp, (_, t) in zip(ref_p, near, strict=True)])
    assert p_err < 0.12
    assert p_err < ref_p_err
    # time: up to the unknown scale (the emulated job is 3% of the trace's step times)
    # its shape error (spread of log(predicted / true)) must beat the reference's
    ratio = np.array([r["time_ms"] / t.time_ms for r, t in near])
    ref_ratio = ref_t / np.array([t.time_ms for _, t in near])
    assert np.std(np.log(ratio)) < min(0.2, np.std(np.log(ref_ratio)))
    assert abs(np.median(ratio) / TS - 1) < 0.25


def test_predict_shows_the_overall_power_head(tuned_board):
    """`powerctl predict` answers with the fit's overall power head (the blend that holds
    further from the samples), not the head the strategy decides by."""
    from powerd.predictor.transfer import FittedPredictor

    stored = next(tuned_board.state_dir.glob("workloads/*/resnet/model"))
    fp = FittedPredictor.load(stored)
    assert fp.has_overall
    rows = json.loads(powerctl(tuned_board, "predict", "--workload", "resnet", "--json").stdout)
    modes = np.array([_mode(r).as_tuple() for r in rows])
    shown = np.array([r["power_w"] for r in rows])
    np.testing.assert_allclose(shown, fp.predict_overall(modes)[1], rtol=1e-6)
    assert np.max(np.abs(shown - fp.predict(modes)[1])) > 0.01


def test_pareto_json_and_plot(tuned_board, tmp_path):
    res = powerctl(tuned_board, "pareto", "--workload", "resnet", "--json")
    assert res.returncode == 0, res.stderr
    front = json.loads(res.stdout)
    powers = [r["power_w"] for r in front]
    times = [r["time_ms"] for r in front]
    assert powers == sorted(powers)
    assert all(a > b for a, b in zip(times, times[1:], strict=False))  # faster as power rises
    png = tmp_path / "front.png"
    res = powerctl(tuned_board, "pareto", "--workload", "resnet", "--plot", str(png))
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_predict_unknown_workload_is_a_clear_error(tuned_board):
    res = powerctl(tuned_board, "predict", "--workload", "never-ran", "--json")
    assert res.returncode == 1
    assert "no fitted predictor for workload 'never-ran'" in res.stderr
    assert "resnet" in res.stderr  # lists what it does know


def test_restart_reuses_samples_and_the_fitted_model(tuned_board, nano_trace):
    samples = next(tuned_board.state_dir.glob("workloads/*/resnet/samples.json"))
    n = len(json.loads(samples.read_text())["samples"])
    tuned_board.stop_daemon()
    tuned_board.start_daemon()
    res = powerctl(tuned_board, "predict", "--workload", "resnet", "--json")
    assert res.returncode == 0, res.stderr
    run = run_training_job(
        tuned_board.root, nano_trace, 12, "resnet", TS, endpoint=tuned_board.endpoint, max_s=60
    )
    assert run.final_phase == "tuned"
    assert len(json.loads(samples.read_text())["samples"]) == n  # nothing profiled again


def test_corrupt_store_is_reported_and_ignored(nano_trace):
    with EmulatedBoard("orin-nano", nano_trace, time_scale=TS, strategy="powertrain") as b:
        wdir = b.state_dir / "workloads" / b.status()["board_key"] / "broken"
        wdir.mkdir(parents=True)
        (wdir / "samples.json").write_text("{ not json")
        (wdir / "model").mkdir()
        (wdir / "model" / "fitted.json").write_text("[]")
        run = run_training_job(b.root, nano_trace, 15, "broken", TS, endpoint=b.endpoint, max_s=180)
        assert run.final_phase == "tuned"
        log = b.daemon_log.read_text()
        assert "ignoring corrupt samples file" in log
        assert json.loads((wdir / "samples.json").read_text())["samples"]  # rewritten


def _mode(r):
    from powerd.modes import PowerMode

    return PowerMode(r["cores"], r["cpu_khz"], r["gpu_hz"], r["emc_hz"])


def test_predict_finds_an_evicted_workload_whose_name_the_store_slugs(nano_trace):
    """A workload named with characters the store replaces in its directory name (x@bs1 is
    stored as x_bs1) is still found by `predict` once evicted from memory."""
    from powerd import protocol as p
    from powerd.client import call_once

    with EmulatedBoard(
        "orin-nano",
        nano_trace,
        time_scale=TS,
        strategy="powertrain",
        config={"state": {"workloads_in_memory": 1}},
    ) as b:
        for name in ("net@bs1", "other"):
            run = run_training_job(b.root, nano_trace, 15, name, TS, endpoint=b.endpoint, max_s=180)
            assert run.final_phase == "tuned", b.log_tail()
        reply = call_once(b.endpoint, p.Predict(workload="net@bs1"), timeout_s=30)
        assert isinstance(reply, p.Predictions), reply
        assert len(reply.rows) == len(nano_trace.rows)
