import shutil
from pathlib import Path

import numpy as np
import pytest

from powerd.device.detect import detect_board
from powerd.device.errors import DeviceError
from powerd.device.modespace import ModeSpace, discover_mode_space
from powerd.modes import PowerMode
from powerd.sim.trace import Trace
from powerd.sim.tree import build_tree


@pytest.fixture
def agx_root(sim_root: Path, agx_trace: Trace) -> Path:
    build_tree(sim_root, "orin-agx", agx_trace)
    return sim_root


def test_agx_axes_come_from_the_frequency_tables(agx_root: Path, agx_trace: Trace) -> None:
    space = discover_mode_space(detect_board(agx_root))
    assert space.cores == list(range(1, 13))
    assert space.cpu_khz == agx_trace.axis("cpu_khz")
    assert space.gpu_hz == agx_trace.axis("gpu_hz")
    assert space.emc_hz == agx_trace.axis("emc_hz")  # possible_rates in kHz -> Hz
    assert space.size == 12 * 14 * 13 * 4
    assert space.max_mode() == PowerMode(12, 2201600, 1300500000, 3199000000)
    assert space.min_mode() == PowerMode(1, 268800, 114750000, 204000000)


def test_array_matches_modes_and_is_cached(agx_root: Path) -> None:
    space = discover_mode_space(detect_board(agx_root), core_counts=[2, 4])
    arr = space.as_array()
    modes = space.modes()
    assert arr.dtype == np.int64 and arr.shape == (space.size, 4)
    assert [tuple(r) for r in arr.tolist()] == [m.as_tuple() for m in modes]
    assert space.as_array() is arr
    with pytest.raises(ValueError):
        arr[0, 0] = 99  # shared: read-only
    for i in (0, 17, space.size - 1):
        assert space.index(modes[i]) == i and space.contains(modes[i])
    off = PowerMode(3, modes[0].cpu_khz, modes[0].gpu_hz, modes[0].emc_hz)
    assert not space.contains(off) and off not in space
    with pytest.raises(ValueError, match="not in the mode space"):
        space.index(off)


def test_core_counts_narrow_and_are_validated(agx_root: Path) -> None:
    board = detect_board(agx_root)
    assert discover_mode_space(board, core_counts=[6, 2, 4]).cores == [2, 4, 6]
    with pytest.raises(DeviceError, match=r"core_counts \[13\] outside 1..12"):
        discover_mode_space(board, core_counts=[2, 13])


def test_cpu_frequencies_are_the_intersection_of_clusters(agx_root: Path) -> None:
    avail = agx_root / "sys/devices/system/cpu/cpufreq/policy8/scaling_available_frequencies"
    freqs = avail.read_text().split()
    avail.write_text(" ".join(freqs[:-1]) + "\n")  # this cluster lacks the top frequency
    space = discover_mode_space(detect_board(agx_root))
    assert space.cpu_khz == [int(f) for f in freqs[:-1]]


def test_emc_falls_back_to_config_then_to_the_current_rate(agx_root: Path) -> None:
    (agx_root / "sys/kernel/debug/bpmp/debug/emc/possible_rates").unlink()
    board = detect_board(agx_root)
    assert discover_mode_space(board, emc_rates_hz=[3199000000, 665600000]).emc_hz == [
        665600000,
        3199000000,
    ]
    assert discover_mode_space(board).emc_hz == [3199000000]  # the rate DVFS runs at


def test_no_emc_debugfs_means_emc_not_driven(agx_root: Path) -> None:
    shutil.rmtree(agx_root / "sys/kernel/debug")
    space = discover_mode_space(detect_board(agx_root), emc_rates_hz=[665600000])
    assert space.emc_hz == [0]


def test_nano_space(sim_root: Path, nano_trace: Trace) -> None:
    build_tree(sim_root, "orin-nano", nano_trace)
    space = discover_mode_space(detect_board(sim_root), core_counts=[2, 4, 6])
    assert space.size == 3 * 10 * 3 * 2  # 180 modes, like the trace
    assert {m.as_tuple() for m in space.modes()} == {tuple(r) for r in nano_trace.modes_array}


def test_empty_axis_is_refused() -> None:
    with pytest.raises(DeviceError, match="empty GPU frequency list"):
        ModeSpace([1], [100], [], [1])
