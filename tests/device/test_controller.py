"""The controller against a running emulator: write order, read-back, failure recovery."""

import errno
import json
import os
import time
from pathlib import Path

import pytest

from powerd.device import sysfs
from powerd.device.controller import Controller
from powerd.device.detect import detect_board
from powerd.device.errors import SwitchError, SysfsWriteError
from powerd.modes import PowerMode
from powerd.sim.emulator import Emulator, read_effective_mode

# In-process emulator on a loaded 2-core machine: give read-back time (production: 0.2 s).
VERIFY_S = 1.0

MID = PowerMode(4, 1036800, 522750000, 2133000000)
HIGH = PowerMode(12, 2201600, 1300500000, 3199000000)
LOW = PowerMode(2, 268800, 114750000, 204000000)


def make_controller(emu: Emulator, state_dir: Path | None = None, cls=Controller) -> Controller:
    return cls(detect_board(emu.root), verify_timeout_s=VERIFY_S, state_dir=state_dir)


def snapshot(ctl: Controller) -> dict[str, str]:
    return {str(p): p.read_text().strip() for p in ctl.knob_files()}


def test_apply_switches_and_reads_back(emulated_agx: Emulator, tmp_path: Path) -> None:
    ctl = make_controller(emulated_agx, tmp_path / "state")
    for mode in (MID, HIGH, LOW):
        assert ctl.apply(mode) == mode
        assert ctl.current() == mode
        assert emulated_agx.effective_mode() == mode
        assert read_effective_mode(emulated_agx.root) == mode
        assert ctl.last_verified == mode
    assert emulated_agx.rejected_writes == []
    cpu = emulated_agx.root / "sys/devices/system/cpu"
    assert (cpu / "online").read_text().strip() == "0-1"
    assert (cpu / "cpu2/online").read_text().strip() == "0"
    assert (ctl.board.gpu_dir / "device/railgate_enable").read_text().strip() == "0"


def test_writes_happen_in_a_safe_order(emulated_agx: Emulator) -> None:
    ctl = make_controller(emulated_agx)
    ctl.apply(LOW)
    emulated_agx.clear_logs()
    ctl.apply(HIGH)  # raise: cores first, then max before min
    seen = [(w.path, w.value) for w in emulated_agx.seen_writes]
    paths = [p for p, _ in seen]
    policy4_max = "/sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq"
    policy4_min = "/sys/devices/system/cpu/cpufreq/policy4/scaling_min_freq"
    assert paths.index("/sys/devices/system/cpu/cpu4/online") < paths.index(policy4_max)
    assert paths.index(policy4_max) < paths.index(policy4_min)
    gpu = "/sys/devices/17000000.ga10b/devfreq/17000000.ga10b"
    assert paths.index(f"{gpu}/max_freq") < paths.index(f"{gpu}/min_freq")
    assert all(w.accepted for w in emulated_agx.seen_writes)

    emulated_agx.clear_logs()
    ctl.apply(LOW)  # lower: min before max, cores offline last
    paths = [w.path for w in emulated_agx.seen_writes]
    assert paths.index(policy4_min) < paths.index(policy4_max)
    assert paths.index(f"{gpu}/min_freq") < paths.index(f"{gpu}/max_freq")
    last_freq_write = max(i for i, p in enumerate(paths) if not p.endswith("/online"))
    first_offline = min(i for i, p in enumerate(paths) if p.endswith("/online"))
    assert first_offline > last_freq_write
    assert emulated_agx.rejected_writes == []


def test_emc_is_locked_before_its_rate(emulated_agx: Emulator) -> None:
    ctl = make_controller(emulated_agx)
    ctl.apply(MID)
    paths = [w.path for w in emulated_agx.seen_writes]
    emc = "/sys/kernel/debug/bpmp/debug/clk/emc"
    assert paths.index(f"{emc}/mrq_rate_locked") < paths.index(f"{emc}/rate")


def test_knob_files_are_every_file_written(emulated_agx: Emulator) -> None:
    ctl = make_controller(emulated_agx)
    files = {p.resolve() for p in ctl.knob_files()}
    assert len(files) == 11 + 3 * 2 + 2 + 1 + 2  # online, policies, GPU, railgate, EMC
    root = emulated_agx.root
    assert (root / "sys/devices/system/cpu/cpu0/online").resolve() not in files
    ctl.apply(LOW)
    ctl.apply(HIGH)
    written = {(root / w.path.lstrip("/")).resolve() for w in emulated_agx.seen_writes}
    assert written <= files


class WrongOrderController(Controller):
    """Writes every frequency window in the reverse of the safe order."""

    def freq_writes(self, cur_min, cur_max, new_min, new_max):
        return list(reversed(super().freq_writes(cur_min, cur_max, new_min, new_max)))


def test_wrong_write_order_is_rejected_and_detected(emulated_agx: Emulator) -> None:
    ctl = make_controller(emulated_agx, cls=WrongOrderController)
    ctl.verify_timeout_s = 0.3
    ctl.apply(HIGH)  # from the wide-open baseline either order happens to be valid
    with pytest.raises(SwitchError) as exc:
        ctl.apply(LOW)  # max below the pinned min first: an older kernel says EINVAL
    err = exc.value
    rejected = {r.path for r in emulated_agx.rejected_writes}
    assert "/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq" in rejected
    assert any("min" in r.reason and ">" in r.reason for r in emulated_agx.rejected_writes)
    assert any("scaling_cur_freq" in p or "scaling_max_freq" in p for p in err.problems)
    # A failed switch leaves a known state: here the previous mode could be re-applied.
    assert err.left_in == "previous" and err.left_mode == HIGH
    assert ctl.current() == HIGH
    assert emulated_agx.effective_mode() == HIGH
    assert "board left in the previous mode" in str(err)


def test_direct_write_of_min_above_max_is_reverted(emulated_agx: Emulator) -> None:
    """What a controller without read-back would miss: the file does not keep the value."""
    ctl = make_controller(emulated_agx)
    ctl.apply(MID)
    min_file = ctl.board.clusters[0].policy_dir / "scaling_min_freq"
    sysfs.write_value(min_file, HIGH.cpu_khz)
    deadline = time.monotonic() + 2.0
    while min_file.read_text().strip() != str(MID.cpu_khz) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert min_file.read_text().strip() == str(MID.cpu_khz)
    assert emulated_agx.rejected_writes[-1].value == str(HIGH.cpu_khz)
    assert ctl.current() == MID


def _inject(monkeypatch, fail_when, err: int) -> list[tuple[Path, str]]:
    """Make sysfs.write_value refuse some writes like the kernel would (tests run as root,
    so chmod cannot produce EACCES)."""
    real = sysfs.write_value
    refused: list[tuple[Path, str]] = []

    def write_value(path, value) -> None:
        if fail_when(Path(path), str(value)):
            refused.append((Path(path), str(value)))
            raise SysfsWriteError(path, str(value), err, os.strerror(err))
        real(path, value)

    monkeypatch.setattr(sysfs, "write_value", write_value)
    return refused


def test_einval_leaves_the_previous_mode_and_names_the_file(
    emulated_agx: Emulator, monkeypatch
) -> None:
    ctl = make_controller(emulated_agx)
    ctl.apply(MID)
    refused = _inject(
        monkeypatch,
        lambda p, v: p.name == "max_freq" and v == str(HIGH.gpu_hz),
        errno.EINVAL,
    )
    with pytest.raises(SwitchError) as exc:
        ctl.apply(HIGH)
    err = exc.value
    assert refused, "the injected failure must have been hit"
    assert "max_freq" in str(err) and "Invalid argument" in str(err)
    assert err.left_in == "previous" and err.left_mode == MID
    assert ctl.current() == MID
    assert emulated_agx.effective_mode() == MID


def test_eacces_on_first_switch_restores_the_baseline(
    emulated_agx: Emulator, monkeypatch, tmp_path: Path
) -> None:
    ctl = make_controller(emulated_agx, tmp_path / "state")
    before = snapshot(ctl)
    _inject(
        monkeypatch,
        lambda p, v: p.name == "rate" and v == str(MID.emc_hz),
        errno.EACCES,
    )
    with pytest.raises(SwitchError) as exc:
        ctl.apply(MID)
    err = exc.value
    assert err.left_in == "baseline"
    assert "/emc/rate" in str(err) and "Permission denied" in str(err)
    assert snapshot(ctl) == before  # EMC back to unlocked, cores online, limits wide
    assert not (tmp_path / "state/baseline.json").exists()  # restored, so not pending
    assert ctl.last_verified is None


def test_failed_recovery_reports_unknown_and_keeps_the_baseline(
    emulated_agx: Emulator, monkeypatch, tmp_path: Path
) -> None:
    ctl = make_controller(emulated_agx, tmp_path / "state")
    ctl.apply(MID)
    gpu_max = ctl.board.gpu_dir / "max_freq"
    _inject(monkeypatch, lambda p, v: p == gpu_max, errno.EIO)
    with pytest.raises(SwitchError) as exc:
        ctl.apply(HIGH)
    err = exc.value
    assert err.left_in == "unknown"
    assert "UNKNOWN" in str(err)
    assert any("restoring baseline" in p for p in err.problems)
    assert (tmp_path / "state/baseline.json").exists()  # still pending for `powerd restore`


def test_baseline_saved_before_the_first_write(emulated_agx: Emulator, tmp_path: Path) -> None:
    ctl = make_controller(emulated_agx, tmp_path / "state")
    before = snapshot(ctl)
    ctl.apply(LOW)
    saved = json.loads((tmp_path / "state/baseline.json").read_text())
    values = {item["path"]: item["value"] for item in saved["online"]}
    assert set(values.values()) == {"1"}
    policy0 = next(lim for lim in saved["limits"] if lim["label"] == "cpu policy0")
    assert str(policy0["max"]) == before[str(ctl.board.clusters[0].policy_dir / "scaling_max_freq")]
    assert saved["emc"]["locked"] == 0


def test_invalid_modes_are_refused_before_any_write(emulated_agx: Emulator, tmp_path) -> None:
    ctl = make_controller(emulated_agx, tmp_path / "state")
    for bad in (
        PowerMode(13, MID.cpu_khz, MID.gpu_hz, MID.emc_hz),
        PowerMode(4, 1000, MID.gpu_hz, MID.emc_hz),
        PowerMode(4, MID.cpu_khz, 5, MID.emc_hz),
        PowerMode(4, MID.cpu_khz, MID.gpu_hz, 123),
        PowerMode(4, MID.cpu_khz, MID.gpu_hz, 0),
    ):
        with pytest.raises(ValueError):
            ctl.apply(bad)
    assert emulated_agx.seen_writes == []
    assert not (tmp_path / "state/baseline.json").exists()


def test_nano_switches(emulated_nano: Emulator) -> None:
    ctl = make_controller(emulated_nano)
    mode = PowerMode(4, 1344000, 510000000, 665600000)
    ctl.apply(mode)
    assert ctl.current() == mode == emulated_nano.effective_mode()
    root = emulated_nano.root
    assert (root / "sys/devices/system/cpu/online").read_text().strip() == "0-3"
    ctl.apply(PowerMode(6, 1510400, 624750000, 2133000000))
    assert emulated_nano.rejected_writes == []


# ---- another tool rewrites a pinned value (#8 item 8) -----------------------------------


def test_external_changes_detects_a_rewrite_behind_powerds_back(emulated_agx: Emulator) -> None:
    from powerd.device import sysfs
    from powerd.device.controller import ExternalChange

    ctl = Controller(detect_board(emulated_agx.root), verify_timeout_s=1.0)
    assert ctl.external_changes() == []  # nothing pinned yet
    mode = PowerMode(8, 1036800, 522750000, 2133000000)
    ctl.apply(mode)
    assert ctl.external_changes() == []
    # jetson_clocks-style: max the GPU and let EMC go back to DVFS
    gpu_max = ctl.board.gpu_dir / "max_freq"
    top = gpu_max.parent.joinpath("available_frequencies").read_text().split()[-1]
    sysfs.write_value(gpu_max, top)
    sysfs.write_value(emulated_agx.root / "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked", 0)
    sysfs.write_value(emulated_agx.root / "sys/devices/system/cpu/cpu11/online", 1)
    changes = ctl.external_changes()
    dev_gpu = "/" + str(gpu_max.relative_to(emulated_agx.root))
    assert ExternalChange(dev_gpu, "522750000", top) in changes
    assert (
        ExternalChange("/sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked", "1", "0") in changes
    )
    assert ExternalChange("/sys/devices/system/cpu/cpu11/online", "0", "1") in changes
    # Unlocked, DVFS may already have moved the EMC rate too (as on a real board): the
    # only change allowed beyond the three writes above.
    others = [c for c in changes if not c.file.endswith(("max_freq", "mrq_rate_locked", "online"))]
    assert all(c.file.endswith("/emc/rate") for c in others), changes
    assert ctl.reapply() == mode
    assert ctl.external_changes() == []


def test_external_changes_is_cheap(emulated_agx: Emulator) -> None:
    """One read per pinned file and no waiting: counted, not timed.

    Only this thread's calls count: the emulator's own thread reads and sleeps through the
    same functions while it answers the switch, later on a loaded machine."""
    import threading
    from unittest import mock

    from powerd.device import controller as controller_mod

    ctl = Controller(detect_board(emulated_agx.root), verify_timeout_s=1.0)
    ctl.apply(PowerMode(4, 1036800, 522750000, 2133000000))
    pinned = len(ctl.pinned_values())
    me = threading.get_ident()
    real_read, real_sleep = controller_mod.sysfs.read_text, time.sleep
    ours = []

    def counted_read(path):
        if threading.get_ident() == me:
            ours.append(path)
        return real_read(path)

    def no_wait(seconds):
        if threading.get_ident() == me:
            raise AssertionError("external_changes must not wait")
        real_sleep(seconds)

    with (
        mock.patch.object(controller_mod.sysfs, "read_text", counted_read),
        mock.patch("time.sleep", no_wait),
    ):
        assert ctl.external_changes() == []
    assert len(ours) == pinned


def test_yield_leaves_the_changed_files_to_the_other_tool(emulated_agx: Emulator, tmp_path) -> None:
    """`on_external_change = "yield"`: what the other tool changed stays as it set it, every
    other pinned value goes back to the baseline (also the other end of a window it changed
    one end of), nothing stays pinned."""
    from powerd.sim.harness import knob_snapshot

    root = emulated_agx.root
    ctl = Controller(detect_board(root), verify_timeout_s=1.0, state_dir=tmp_path / "state")
    before = knob_snapshot(root)
    ctl.apply(PowerMode(4, 1036800, 522750000, 2133000000))
    gpu = ctl.board.gpu_dir
    sysfs.write_value(gpu / "max_freq", 1300500000)  # jetson_clocks-style
    assert _wait_read(gpu / "max_freq", "1300500000")
    changes = ctl.external_changes()
    assert [c.file for c in changes] == ["/" + str((gpu / "max_freq").relative_to(root))]
    report = ctl.yield_board(changes)
    assert report.ok, report.problems
    assert "left to the tool that changed them" in str(report)
    after = knob_snapshot(root)
    gpu_keys = {k for k in after if "devfreq" in k}
    assert {k: v for k, v in after.items() if k not in gpu_keys} == {
        k: v for k, v in before.items() if k not in gpu_keys
    }
    # the tool wrote max only: it keeps it; min goes back to the baseline, not powerd's pin
    assert (gpu / "max_freq").read_text().strip() == "1300500000"
    min_key = next(k for k in gpu_keys if k.endswith(str(gpu.relative_to(root)) + "/min_freq"))
    assert (gpu / "min_freq").read_text().strip() == before[min_key] != "522750000"
    assert ctl.last_verified is None and not ctl.baseline.pending
    assert ctl.external_changes() == []


def _wait_read(path: Path, want: str, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while path.read_text().strip() != want:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_hardware_logs_external_changes(emulated_agx: Emulator, tmp_path, caplog) -> None:
    from powerd.config import parse_config
    from powerd.hardware import Hardware

    cfg = parse_config(
        {"device": {"root": str(emulated_agx.root)}, "state": {"dir": str(tmp_path / "s")}}
    )
    hw = Hardware.open(cfg)
    try:
        assert hw.external_changes() == []
        hw.apply(PowerMode(4, 1036800, 522750000, 2133000000))
        online = emulated_agx.root / "sys/devices/system/cpu/cpu7/online"
        sysfs.write_value(online, 1)
        with caplog.at_level("DEBUG"):  # the control path warns, once per fight
            changes = hw.external_changes()
        assert [(c.file, c.expected, c.found) for c in changes] == [
            ("/sys/devices/system/cpu/cpu7/online", "0", "1")
        ]
        assert "external change to a pinned value: /sys/devices/system/cpu/cpu7/online" in (
            caplog.text
        )
        assert hw.reapply() == hw.current_mode and hw.external_changes() == []
    finally:
        hw.restore()
        hw.close()
