"""`powerctl status`'s header: the pinned mode named as everything else names it (job.mode,
the job lines' messages, the daemon's log), and the budget the board follows."""

from __future__ import annotations

from powerd.cli import format_status
from powerd.modes import PowerMode


def _status(**fields) -> dict:
    """A status reply with no job, as the daemon sends it, with `fields` set."""
    base = {
        "board": "orin-agx",
        "mode": None,
        "power_w": 9.5,
        "budget_w": 15.0,
        "limits_w": {"min": 5, "max": 60},
        "jobs": [],
    }
    return {**base, **fields}


def test_the_status_header_formats_the_mode_like_power_mode() -> None:
    # clocks just under a whole MHz: rounding would read 115/666/730, truncation 114/665/729
    mode = PowerMode(cores=4, cpu_khz=729600, gpu_hz=114750000, emc_hz=665600000)
    status = _status(mode=mode.as_dict())
    header = next(ln for ln in format_status(status).splitlines() if ln.startswith("mode "))
    assert header == f"mode      {mode}", header
    assert "cpu 729 MHz/gpu 114 MHz/emc 665 MHz" in header


def _budget_line(budget_w: float, default_w: float) -> str:
    status = _status(budget_w=budget_w, default_budget_w=default_w)
    return next(ln for ln in format_status(status).splitlines() if ln.startswith("budget "))


def test_the_status_header_names_the_default_budget_when_jobs_set_a_lower_one() -> None:
    line = _budget_line(12.0, 25.0)
    assert "12 W" in line and "default 25 W" in line and "limits 5-60 W" in line, line
    # no job budget below the default: one figure
    line = _budget_line(25.0, 25.0)
    assert line == "budget    25 W (limits 5-60 W)", line


def test_a_step_time_jobs_fastest_measured_time_is_rounded_like_other_measured_times() -> None:
    job = {
        "id": "abc",
        "workload": "st",
        "phase": "tuned",
        "kind": "training",
        "budget_w": 80.0,
        "objective": "step_time",
        "step_time_ms": 0.5,
        "fastest_ms": 0.8895129940356128,
        "steps": 2008,
        "profiled_modes": 12,
    }
    status = _status(budget_w=80.0, limits_w={"min": 5, "max": 80}, jobs=[job])
    line = next(ln for ln in format_status(status).splitlines() if ln.startswith("  abc "))
    assert "step time 0.5 ms within 80 W (fastest measured 0.9 ms)" in line, line


def test_the_workload_lines_say_what_profiling_cost() -> None:
    cost = {"modes_measured": 9, "seconds": 12.34, "share_above_budget": 0.225}
    status = _status(
        workloads=["resnet", "yolo"],
        workload_state={
            "resnet": {"training": {"profiled_modes": 9, "fitted": True, "fit_method": "x"}},
            "yolo": {"inference": {"pairs_profiled": 12, "batch_sizes": [1, 4]}},
        },
        profiling={"resnet": {**cost, "share_above_budget_1w": 0.029}},
        inference_profiling={"yolo": {**cost, "share_above_budget_1w": 0.0}},
    )
    lines = format_status(status).splitlines()
    resnet = next(ln for ln in lines if ln.startswith("  resnet"))
    assert resnet.endswith(
        "9 modes profiled, fitted (x), profiled for 12.3 s (22 % of it over the budget, "
        "2.9 % over it by > 1 W)"
    ), resnet
    yolo = next(ln for ln in lines if ln.startswith("  yolo"))
    assert "12 pairs profiled (b 1,4), profiled for 12.3 s (22 % of it over" in yolo, yolo
