"""`powerctl status` names the pinned mode as everything else does (job.mode, the job lines'
messages, the daemon's log): one mode reads the same everywhere."""

from __future__ import annotations

from powerd.cli import format_status
from powerd.modes import PowerMode


def test_the_status_header_formats_the_mode_like_power_mode() -> None:
    # clocks just under a whole MHz: rounding would read 115/666/730, truncation 114/665/729
    mode = PowerMode(cores=4, cpu_khz=729600, gpu_hz=114750000, emc_hz=665600000)
    status = {
        "board": "orin-agx",
        "mode": mode.as_dict(),
        "power_w": 9.5,
        "budget_w": 15.0,
        "limits_w": {"min": 5, "max": 60},
        "jobs": [],
    }
    header = next(ln for ln in format_status(status).splitlines() if ln.startswith("mode "))
    assert header == f"mode      {mode}", header
    assert "cpu 729 MHz/gpu 114 MHz/emc 665 MHz" in header
