"""Save/restore of the admin's state: GEOPM-style, crash-safe, restorable without a daemon."""

import json
import time
from pathlib import Path

import pytest

from powerd.device import sysfs
from powerd.device.baseline import BASELINE_FILE, Baseline, restore_baseline
from powerd.device.controller import Controller
from powerd.device.detect import detect_board
from powerd.modes import PowerMode
from powerd.sim.emulator import Emulator

MID = PowerMode(4, 1036800, 522750000, 2133000000)
LOW = PowerMode(2, 268800, 114750000, 204000000)


def controller(emu: Emulator, state_dir: Path | None) -> Controller:
    return Controller(detect_board(emu.root), verify_timeout_s=1.0, state_dir=state_dir)


def knob_state(ctl: Controller) -> dict[str, str]:
    """What "restored" means: every knob file holds its baseline value again; the EMC rate
    only counts while locked (unlocked, DVFS owns it)."""
    state = {str(p): p.read_text().strip() for p in ctl.knob_files()}
    emc = ctl.board.emc_dir
    assert emc is not None
    if state[str(emc / "mrq_rate_locked")] == "0":
        del state[str(emc / "rate")]
    return state


def wait_for(cond, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_restore_without_a_daemon_from_root_and_state_dir(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    before = knob_state(ctl)
    ctl.apply(MID)
    ctl.apply(LOW)
    assert (state / BASELINE_FILE).exists()
    assert knob_state(ctl) != before
    report = restore_baseline(emulated_agx.root, state)  # nothing but (root, state_dir)
    assert report.found and report.restored and report.ok, report.problems
    assert knob_state(ctl) == before
    assert not (state / BASELINE_FILE).exists()
    assert emulated_agx.rejected_writes == []
    assert wait_for(lambda: emulated_agx.effective_mode().cores == 12)
    assert "restored" in str(report)


def test_nothing_to_restore(tmp_path: Path) -> None:
    report = restore_baseline(tmp_path / "root", tmp_path / "state")
    assert not report.found and report.ok
    assert "nothing to restore" in str(report)


def test_saved_file_is_written_atomically_and_never_overwritten(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    baseline = Baseline(emulated_agx.root, state)
    assert baseline.save(ctl.knobs(), "board-key") is True
    first = (state / BASELINE_FILE).read_text()
    assert [p.name for p in state.iterdir()] == [BASELINE_FILE]  # no temp file left
    ctl.apply(LOW)  # the board changes; a second save must keep the first one
    assert baseline.save(ctl.knobs(), "board-key") is False
    assert (state / BASELINE_FILE).read_text() == first
    assert json.loads(first)["board"] == "board-key"


def test_crash_recovery_restores_the_state_from_before_the_crash(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = controller(emulated_agx, state)
    before = knob_state(first)
    first.apply(LOW)
    saved = (state / BASELINE_FILE).read_text()
    del first  # the daemon dies: no restore, the file stays behind

    second = controller(emulated_agx, state)  # a restarted daemon
    assert second.baseline.pending
    second.apply(MID)  # must not save the crashed daemon's mode as the "baseline"
    assert (state / BASELINE_FILE).read_text() == saved
    report = restore_baseline(emulated_agx.root, state)
    assert report.restored, report.problems
    assert knob_state(second) == before


def test_unusual_baseline_offline_cores_and_locked_emc(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    """An admin baseline with cores 8-11 offline and EMC pinned comes back as it was."""
    root = emulated_agx.root
    cpu = root / "sys/devices/system/cpu"
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    for n in range(8, 12):
        sysfs.write_value(cpu / f"cpu{n}/online", 0)
    sysfs.write_value(emc / "mrq_rate_locked", 1)
    sysfs.write_value(emc / "rate", 665600000)
    assert wait_for(lambda: (cpu / "online").read_text().strip() == "0-7")
    assert wait_for(lambda: emulated_agx.effective_mode().emc_hz == 665600000)

    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    before = knob_state(ctl)
    assert before[str(emc / "rate")] == "665600000"
    ctl.apply(PowerMode(12, 2201600, 1300500000, 3199000000))  # cores 8-11 online
    report = ctl.restore_baseline()
    assert report.restored, report.problems
    assert knob_state(ctl) == before
    assert (cpu / "online").read_text().strip() == "0-7"
    assert wait_for(lambda: emulated_agx.effective_mode().emc_hz == 665600000)
    assert emulated_agx.rejected_writes == []


def test_restore_reports_what_did_not_come_back(emulated_agx: Emulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    ctl.apply(MID)
    data = json.loads((state / BASELINE_FILE).read_text())
    data["flags"].append({"path": "/sys/no/such/railgate_enable", "value": "1"})
    (state / BASELINE_FILE).write_text(json.dumps(data))
    report = restore_baseline(emulated_agx.root, state, timeout_s=0.2)
    assert report.found and not report.restored and not report.ok
    assert any("/sys/no/such/railgate_enable" in p for p in report.problems)
    assert (state / BASELINE_FILE).exists()  # kept for another try
    assert "NOT fully restored" in str(report)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 1}'])
def test_corrupt_baseline_is_reported_and_kept(tmp_path: Path, text: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / BASELINE_FILE).write_text(text)
    report = restore_baseline(tmp_path, state)
    assert report.found and not report.ok
    assert "corrupt" in report.problems[0]
    assert (state / BASELINE_FILE).exists()


def test_memory_only_baseline(emulated_nano: Emulator) -> None:
    ctl = controller(emulated_nano, None)
    before = knob_state(ctl)
    ctl.apply(PowerMode(2, 268800, 306000000, 665600000))
    assert ctl.baseline.pending and ctl.baseline.path is None
    assert ctl.restore_baseline().restored
    assert knob_state(ctl) == before and not ctl.baseline.pending
