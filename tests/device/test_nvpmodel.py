"""Reading the admin's nvpmodel mode: the conf's PARAM and POWER_MODEL blocks, the status
file, `nvpmodel -q`, all under the device root."""

import os
import stat
from pathlib import Path

from powerd.device import nvpmodel
from powerd.device.sysfs import DeviceRoot
from powerd.sim.emulator import Emulator

CONF = """
# a vendor-style file: comments, PARAM blocks, modes, a default
< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_1 /sys/devices/system/cpu/cpu1/online
< PARAM TYPE=FILE NAME=CPU_A78_0 >
MIN_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq
MAX_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq
< PARAM TYPE=CLOCK NAME=EMC_CLK >
FREQ_TABLE /sys/kernel/debug/bpmp/debug/clk/emc/possible_rates
< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_1 1
CPU_A78_0 MIN_FREQ 729600
CPU_A78_0 MAX_FREQ -1
GPU_POWER_CONTROL_ENABLE GPU_PWR_CNTL_EN on
< POWER_MODEL ID=2 NAME=MODE_30W >
CPU_ONLINE CORE_1 0
CPU_A78_0 MAX_FREQ 1728000   # trailing comment
< PM_CONFIG DEFAULT=2 >
"""


def test_parse_conf_blocks() -> None:
    conf = nvpmodel.parse_conf(CONF)
    assert conf.default_id == 2
    assert sorted(conf.modes) == [0, 2]
    assert conf.modes[2].name == "MODE_30W"
    assert conf.modes[2].settings[("CPU_A78_0", "MAX_FREQ")] == "1728000"
    assert conf.params[("CPU_ONLINE", "CORE_1")] == "/sys/devices/system/cpu/cpu1/online"
    assert ("EMC_CLK", "FREQ_TABLE") not in conf.params  # only FILE params name knob files


def test_active_mode_from_status_then_query_then_default(tmp_path: Path) -> None:
    dev = DeviceRoot(tmp_path)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nvpmodel.conf").write_text(CONF)
    assert nvpmodel.active_mode(dev) == nvpmodel.ActiveMode(
        2, "MODE_30W", "/etc/nvpmodel.conf (PM_CONFIG DEFAULT)"
    )
    binary = tmp_path / "usr/sbin/nvpmodel"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho 'NV Power Mode: MAXN'\necho 0\n")
    os.chmod(binary, os.stat(binary).st_mode | stat.S_IXUSR)
    assert nvpmodel.active_mode(dev) == nvpmodel.ActiveMode(0, "MAXN", "nvpmodel -q")
    status = tmp_path / "var/lib/nvpmodel/status"
    status.parent.mkdir(parents=True)
    status.write_text("pmode:0002 fmode:quiet\n")
    active = nvpmodel.active_mode(dev)
    assert active is not None and active.id == 2 and active.source == "/var/lib/nvpmodel/status"
    assert active.describe() == "nvpmodel mode 2 (MODE_30W)"


def test_no_nvpmodel(tmp_path: Path) -> None:
    assert nvpmodel.active_mode(DeviceRoot(tmp_path)) is None


def test_emulated_board_mode_values_resolve_to_its_knob_files(emulated_nano: Emulator) -> None:
    dev = DeviceRoot(emulated_nano.root)
    conf = nvpmodel.read_conf(dev)
    assert conf is not None
    active = nvpmodel.active_mode(dev, conf)
    assert active is not None and (active.id, active.name) == (0, "15W")
    values = nvpmodel.mode_file_values(dev, conf, 1)  # the 7 W mode
    policy4 = emulated_nano.root / "sys/devices/system/cpu/cpufreq/policy4"
    # cpu4/cpufreq is a link: the value is keyed by the policy's own file
    assert values[(policy4 / "scaling_min_freq").resolve()] > 0
    assert values[(emulated_nano.root / "sys/devices/system/cpu/cpu5/online").resolve()] == 0
