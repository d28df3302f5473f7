"""Faults the emulator injects: an offline cluster's cpufreq files cannot be read."""

from pathlib import Path

import pytest
from waiting import poll_until

from powerd.device import sysfs
from powerd.device.errors import SysfsReadError


def test_offline_cluster_reads_fail_until_a_core_returns(make_emulated_board) -> None:
    emu = make_emulated_board("orin-nano", offline_reads_fail=True)
    cpu: Path = emu.root / "sys/devices/system/cpu"
    pol = cpu / "cpufreq/policy4"
    max_before = sysfs.read_text(pol / "scaling_max_freq")
    sysfs.write_value(cpu / "cpu4/online", 0)
    assert poll_until(lambda: sysfs.read_text(cpu / "online") == "0-3,5")
    assert sysfs.read_text(pol / "scaling_max_freq") == max_before  # cpu5 still online
    sysfs.write_value(cpu / "cpu5/online", 0)
    assert poll_until(lambda: (pol / "scaling_max_freq").is_dir())
    for name in ("scaling_min_freq", "scaling_max_freq", "cpuinfo_max_freq"):
        with pytest.raises(SysfsReadError):
            sysfs.read_text(cpu / "cpu5/cpufreq" / name)  # through the cpuN link too
    with pytest.raises(OSError):
        with open(pol / "scaling_min_freq") as f:  # root reads fail as well
            f.read()
    sysfs.write_value(cpu / "cpu5/online", 1)
    assert poll_until(lambda: (pol / "scaling_max_freq").is_file())
    assert sysfs.read_text(pol / "scaling_max_freq") == max_before  # the limits it kept
    assert emu.rejected_writes == []


def test_stop_leaves_a_readable_tree(make_emulated_board) -> None:
    emu = make_emulated_board("orin-nano", offline_reads_fail=True)
    cpu: Path = emu.root / "sys/devices/system/cpu"
    for n in (4, 5):
        sysfs.write_value(cpu / f"cpu{n}/online", 0)
    assert poll_until(lambda: (cpu / "cpufreq/policy4/scaling_max_freq").is_dir())
    emu.stop()
    assert (cpu / "cpufreq/policy4/scaling_max_freq").is_file()


def test_without_injection_offline_clusters_stay_readable(make_emulated_board) -> None:
    emu = make_emulated_board("orin-nano")
    cpu: Path = emu.root / "sys/devices/system/cpu"
    for n in (4, 5):
        sysfs.write_value(cpu / f"cpu{n}/online", 0)
    assert poll_until(lambda: sysfs.read_text(cpu / "online") == "0-3")
    assert sysfs.read_text(cpu / "cpufreq/policy4/scaling_max_freq")
    emu.set_offline_reads_fail(True)  # switched on at run time
    assert (cpu / "cpufreq/policy4/scaling_max_freq").is_dir()
