"""`powerctl predict` / `pareto` tables write clocks as every other place does: whole MHz,
truncated (1497.6 MHz reads 1497, as in `powerctl status`, job.mode and the daemon's log)."""

from __future__ import annotations

from powerd.cli import format_front, format_rows
from powerd.modes import PowerMode

MODE = PowerMode(cores=10, cpu_khz=1497600, gpu_hz=726750000, emc_hz=2133000000)


def _cells(table: str) -> list[str]:
    return table.splitlines()[1].split()


def test_predict_rows_truncate_clocks_like_the_mode_string() -> None:
    row = {**MODE.as_dict(), "time_ms": 161.04, "power_w": 24.68}
    cells = _cells(format_rows([row]))
    assert cells[:4] == ["10", "1497", "726", "2133"], cells
    assert f"cpu {cells[1]} MHz/gpu {cells[2]} MHz/emc {cells[3]} MHz" in str(MODE)


def test_pareto_front_rows_truncate_clocks_too() -> None:
    row = {
        **MODE.as_dict(),
        "batch_size": 4,
        "batch_ms": 20.0,
        "latency_ms": 120.0,
        "power_w": 18.5,
        "drains": True,
    }
    cells = _cells(format_front([row]))
    assert cells[:5] == ["4", "10", "1497", "726", "2133"], cells
