"""The emulated file tree is laid out like the real boards (JETSON.md)."""

import os
from pathlib import Path

import pytest

from powerd.modes import PowerMode
from powerd.sim.trace import Trace, TraceRow
from powerd.sim.tree import build_tree, find_layout


def test_agx_identity_files_are_nul_terminated(sim_root: Path, agx_trace: Trace) -> None:
    build_tree(sim_root, "orin-agx", agx_trace)
    dt = sim_root / "sys/firmware/devicetree/base"
    assert (dt / "model").read_bytes() == b"NVIDIA Jetson AGX Orin Developer Kit\x00"
    compat = (sim_root / "proc/device-tree/compatible").read_bytes()
    assert compat.endswith(b"nvidia,tegra234\x00") and compat.count(b"\x00") == 3
    release = (sim_root / "etc/nv_tegra_release").read_text().splitlines()[0]
    assert release.startswith("# R35 (release), REVISION: 4.1, GCID:")


def test_cpu_tree(sim_root: Path, agx_trace: Trace) -> None:
    build_tree(sim_root, "orin-agx", agx_trace)
    cpu = sim_root / "sys/devices/system/cpu"
    assert not (cpu / "cpu0/online").exists()  # cpu0 cannot go offline
    assert (cpu / "cpu11/online").read_text() == "1\n"
    assert (cpu / "online").read_text() == "0-11\n"
    link = cpu / "cpu5/cpufreq"
    assert link.is_symlink() and os.readlink(link) == "../cpufreq/policy4"
    pol = cpu / "cpufreq/policy4"
    assert (pol / "related_cpus").read_text().split() == ["4", "5", "6", "7"]
    table = [int(x) for x in (pol / "scaling_available_frequencies").read_text().split()]
    assert table == agx_trace.axis("cpu_khz")
    assert int((pol / "scaling_min_freq").read_text()) == table[0]  # DVFS defaults
    assert int((pol / "scaling_max_freq").read_text()) == table[-1]


def test_gpu_layout_per_release(sim_root: Path, agx_trace: Trace, nano_trace: Trace) -> None:
    build_tree(sim_root / "agx", "orin-agx", agx_trace)
    build_tree(sim_root / "nano", "orin-nano", nano_trace)
    agx = sim_root / "agx/sys/devices/17000000.ga10b/devfreq/17000000.ga10b"
    nano = sim_root / "nano/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    assert (agx / "device/of_node/name").read_bytes() == b"ga10b\x00"
    assert (nano / "device/of_node/name").read_bytes() == b"gpu\x00"
    assert (nano / "device/railgate_enable").read_text() == "1\n"
    cls = sim_root / "nano/sys/class/devfreq/17000000.gpu"
    assert cls.resolve() == nano.resolve()
    freqs = [int(x) for x in (nano / "available_frequencies").read_text().split()]
    assert freqs == nano_trace.axis("gpu_hz")


def test_emc_debugfs(sim_root: Path, nano_trace: Trace) -> None:
    build_tree(sim_root, "orin-nano", nano_trace)
    emc = sim_root / "sys/kernel/debug/bpmp/debug"
    assert (emc / "clk/emc/mrq_rate_locked").read_text() == "0\n"
    assert (emc / "clk/emc/rate").read_text() == "2133000000\n"
    assert (emc / "emc/possible_rates").read_text().split() == ["665600", "2133000"]


def test_every_symlink_stays_inside_the_root(sim_root: Path, agx_trace: Trace) -> None:
    build_tree(sim_root, "orin-agx", agx_trace)
    links = [Path(d) / n for d, dirs, files in os.walk(sim_root) for n in dirs + files]
    links = [p for p in links if p.is_symlink()]
    assert len(links) > 20
    for link in links:
        assert not os.path.isabs(os.readlink(link)), link
        assert link.resolve().is_relative_to(sim_root.resolve()), link
        assert link.exists(), f"dangling {link}"


def test_hwmon_index_is_random_per_seed_or_fixed(sim_root: Path, agx_trace: Trace) -> None:
    seen = set()
    for seed in range(6):
        layout = build_tree(sim_root / str(seed), "orin-agx", agx_trace, seed=seed)
        seen.add(tuple(sorted(p.name for p in layout.hwmon.values())))
        assert find_layout(sim_root / str(seed), "orin-agx").hwmon == layout.hwmon
    assert len(seen) > 1
    fixed = build_tree(sim_root / "fixed", "orin-agx", agx_trace, hwmon_index=4)
    assert fixed.hwmon["1-0040"].name == "hwmon4"
    labels = {p.read_text().strip() for p in fixed.hwmon["1-0041"].glob("in*_label")}
    assert labels == {"VDDQ_VDD2_1V8AO", "NC", "sum of shunt voltages"}


def test_bad_inputs(sim_root: Path, nano_trace: Trace) -> None:
    with pytest.raises(ValueError, match="unknown emulated board"):
        build_tree(sim_root, "xavier-agx", nano_trace)
    with pytest.raises(ValueError, match="L4T release"):
        build_tree(sim_root, "orin-nano", nano_trace, l4t="jetpack6")
    big = Trace([TraceRow(PowerMode(8, 268800, 306000000, 665600000), 1.0, 5.0)])
    with pytest.raises(ValueError, match="more cores"):
        build_tree(sim_root, "orin-nano", big)
    with pytest.raises(FileNotFoundError, match="build_tree first"):
        find_layout(sim_root / "empty", "orin-agx")
