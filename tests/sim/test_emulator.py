"""The emulator reacts to writes like a kernel: order matters, refusals revert, clocks lag."""

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import poll_until

from powerd.device.sysfs import read_int, read_text, write_value
from powerd.modes import PowerMode
from powerd.sim.emulator import Emulator, read_effective_mode
from powerd.sim.tree import build_tree

CPU = "sys/devices/system/cpu"
POLICY0 = f"{CPU}/cpufreq/policy0"
POLICY8 = f"{CPU}/cpufreq/policy8"
GPU = "sys/devices/17000000.ga10b/devfreq/17000000.ga10b"
EMC = "sys/kernel/debug/bpmp/debug/clk/emc"


def settle(emu: Emulator) -> None:
    """Wait until the emulator has judged everything written so far: a sentinel write
    (railgate flip) is the last event in its queue."""
    path = emu.root / "sys/devices/17000000.ga10b/railgate_enable"
    before = len(emu.seen_writes)
    write_value(path, 1 - read_int(path))
    assert poll_until(lambda: len(emu.seen_writes) > before)
    time.sleep(0.05)  # and let the cur timers (1-3 ms at time_scale 0.1) fire


def test_min_above_max_is_rejected_and_reverted(emulated_agx: Emulator) -> None:
    root = emulated_agx.root
    low, high = emulated_agx.trace.axis("gpu_hz")[0], emulated_agx.trace.axis("gpu_hz")[-1]
    write_value(root / GPU / "max_freq", low)  # lowering the max below the min (= low): ok
    write_value(root / GPU / "min_freq", high)  # min above max: refused
    settle(emulated_agx)
    assert read_int(root / GPU / "min_freq") == low
    assert read_int(root / GPU / "max_freq") == low
    assert read_int(root / GPU / "cur_freq") == low
    (rej,) = emulated_agx.rejected_writes
    assert rej.path == f"/{GPU}/min_freq" and rej.value == str(high) and rej.kept == str(low)
    assert "EINVAL" in rej.reason


def test_burst_is_judged_in_write_order_not_by_final_file_contents(
    emulated_agx: Emulator,
) -> None:
    """Both writes land before the emulator wakes; the wrong order is still refused,
    because each write is judged against the limits accepted before it."""
    root = emulated_agx.root
    table = emulated_agx.trace.axis("cpu_khz")
    write_value(root / POLICY0 / "scaling_min_freq", table[-1])  # pin at the top first
    settle(emulated_agx)
    emulated_agx.clear_logs()
    write_value(root / POLICY0 / "scaling_max_freq", table[0])  # wrong: max below min
    write_value(root / POLICY0 / "scaling_min_freq", table[0])
    settle(emulated_agx)
    assert [r.path for r in emulated_agx.rejected_writes] == [f"/{POLICY0}/scaling_max_freq"]
    assert read_int(root / POLICY0 / "scaling_max_freq") == table[-1]
    assert read_int(root / POLICY0 / "scaling_min_freq") == table[0]
    assert read_int(root / POLICY0 / "scaling_cur_freq") == table[-1]  # a missed switch

    emulated_agx.clear_logs()
    write_value(root / POLICY0 / "scaling_min_freq", table[0])  # right: min, then max
    write_value(root / POLICY0 / "scaling_max_freq", table[0])
    settle(emulated_agx)
    assert emulated_agx.rejected_writes == []
    assert read_int(root / POLICY0 / "scaling_cur_freq") == table[0]


def test_offline_cluster_refuses_frequency_writes(emulated_agx: Emulator) -> None:
    root = emulated_agx.root
    for n in range(8, 12):
        write_value(root / CPU / f"cpu{n}/online", 0)
    write_value(root / POLICY8 / "scaling_max_freq", 729600)
    settle(emulated_agx)
    assert read_text(root / CPU / "online") == "0-7"
    assert read_text(root / CPU / "offline") == "8-11"
    assert read_int(root / POLICY8 / "scaling_max_freq") == 2201600
    assert "EBUSY" in emulated_agx.rejected_writes[-1].reason
    assert emulated_agx.effective_mode().cores == 8
    write_value(root / CPU / "cpu8/online", 1)
    write_value(root / POLICY8 / "scaling_max_freq", 729600)  # online again: accepted
    settle(emulated_agx)
    assert read_int(root / POLICY8 / "scaling_cur_freq") == 729600
    assert read_text(root / POLICY8 / "affected_cpus") == "8"


def test_emc_rate_needs_the_lock(emulated_agx: Emulator) -> None:
    root = emulated_agx.root
    write_value(root / EMC / "rate", 665600000)  # unlocked: DVFS keeps the rate
    settle(emulated_agx)
    assert read_int(root / EMC / "rate") == 3199000000
    assert "DVFS" in emulated_agx.rejected_writes[-1].reason
    write_value(root / EMC / "mrq_rate_locked", 1)
    write_value(root / EMC / "rate", 600000000)  # rounded up to a supported rate
    settle(emulated_agx)
    assert read_int(root / EMC / "rate") == 665600000
    assert emulated_agx.effective_mode().emc_hz == 665600000
    write_value(root / EMC / "mrq_rate_locked", 0)  # back to DVFS: the top rate under load
    settle(emulated_agx)
    assert read_int(root / EMC / "rate") == 3199000000


def test_cur_follows_the_max_after_a_delay(make_emulated_board) -> None:
    emu: Emulator = make_emulated_board("orin-agx", time_scale=3.0)  # 30-90 ms delay
    root = emu.root
    write_value(root / GPU / "max_freq", 114750000)
    t0 = time.monotonic()
    assert read_int(root / GPU / "cur_freq") == 1300500000  # not yet
    assert poll_until(lambda: read_int(root / GPU / "cur_freq") == 114750000)
    assert time.monotonic() - t0 >= 0.025


def test_garbage_writes_are_rejected(emulated_agx: Emulator) -> None:
    root = emulated_agx.root
    write_value(root / CPU / "cpu3/online", 2)
    write_value(root / GPU / "max_freq", "fast")
    settle(emulated_agx)
    assert read_text(root / CPU / "cpu3/online") == "1"
    assert read_int(root / GPU / "max_freq") == 1300500000
    assert len(emulated_agx.rejected_writes) == 2


def test_off_grid_mode_uses_the_nearest_traced_mode(emulated_agx: Emulator) -> None:
    root = emulated_agx.root
    for n in range(3, 12):  # 3 cores: the trace has 2, 4, 6, ...
        write_value(root / CPU / f"cpu{n}/online", 0)
    settle(emulated_agx)
    mode = emulated_agx.effective_mode()
    assert mode.cores == 3
    assert emulated_agx.target_power_w() == emulated_agx.trace.lookup(mode).power_w
    assert read_effective_mode(root) == mode


def test_effective_mode_read_from_another_process(emulated_nano: Emulator) -> None:
    root = emulated_nano.root
    write_value(root / CPU / "cpu5/online", 0)
    write_value(root / CPU / "cpu4/online", 0)
    settle_path = root / "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    write_value(settle_path / "min_freq", 306000000)
    write_value(settle_path / "max_freq", 306000000)
    assert poll_until(
        lambda: emulated_nano.effective_mode() == PowerMode(4, 1510400, 306000000, 2133000000)
    )
    code = (
        "import sys; from powerd.sim.emulator import read_effective_mode; "
        "print(read_effective_mode(sys.argv[1]).as_tuple())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert out.strip() == str((4, 1510400, 306000000, 2133000000))


def test_idle_emulator_is_cheap(emulated_agx: Emulator) -> None:
    """No busy loop: about a second of emulation costs a few percent of one core."""
    start = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(1.0)
    end = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)
    assert cpu_s < 0.25, f"emulator used {cpu_s:.2f} s of CPU in 1 s"
    assert emulated_agx.running and emulated_agx.errors == 0


def test_stop_ends_the_thread_and_start_is_idempotent(make_emulated_board) -> None:
    emu: Emulator = make_emulated_board("orin-nano")
    assert emu.start() is emu and emu.running
    emu.stop()
    assert not emu.running
    emu.stop()  # twice is fine
    emu.start()  # and it can run again, with fresh watches
    write_value(emu.root / CPU / "cpu5/online", 0)
    assert poll_until(lambda: emu.effective_mode().cores == 5)
    emu.stop()


def test_needs_a_built_tree(sim_root: Path, nano_trace) -> None:
    with pytest.raises(FileNotFoundError, match="build_tree"):
        Emulator(sim_root, "orin-nano", nano_trace)
    build_tree(sim_root, "orin-nano", nano_trace)
    with pytest.raises(ValueError, match="time_scale"):
        Emulator(sim_root, "orin-nano", nano_trace, time_scale=0)
