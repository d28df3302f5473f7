"""Save/restore of the admin's state: GEOPM-style, crash-safe, restorable without a daemon."""

import json
import re
import time
from pathlib import Path

import pytest
from waiting import poll_until

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
    assert poll_until(lambda: emulated_agx.effective_mode().cores == 12)
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
    assert poll_until(lambda: (cpu / "online").read_text().strip() == "0-7")
    assert poll_until(lambda: emulated_agx.effective_mode().emc_hz == 665600000)

    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    before = knob_state(ctl)
    assert before[str(emc / "rate")] == "665600000"
    ctl.apply(PowerMode(12, 2201600, 1300500000, 3199000000))  # cores 8-11 online
    report = ctl.restore_baseline()
    assert report.restored, report.problems
    assert knob_state(ctl) == before
    assert (cpu / "online").read_text().strip() == "0-7"
    assert poll_until(lambda: emulated_agx.effective_mode().emc_hz == 665600000)
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


def _conf_value(root: Path, mode_id: int, param: str, attr: str) -> str:
    """A value of the emulated nvpmodel.conf, read with a plain regex (not powerd's parser)."""
    text = (root / "etc/nvpmodel.conf").read_text()
    block = text.split(f"< POWER_MODEL ID={mode_id} ")[1].split("< ")[0]
    m = re.search(rf"^{param} {attr} (-?\d+)$", block, re.M)
    assert m, (param, attr)
    return m.group(1)


def _tear(path: Path, text: str) -> None:
    path.write_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{not json",
        "[]",
        '{"version": 1}',
        '{"version": 1, "on',
        # parses, but would fail half-way through a restore
        '{"version": 1, "online": [{"pa": 1}], "limits": [], "flags": []}',
        '{"version": 1, "online": [], "limits": [{"label": "x"}], "flags": []}',
    ],
)
def test_torn_baseline_is_set_aside_and_the_board_gets_the_hardware_limits(
    emulated_agx: Emulator, tmp_path: Path, text: str
) -> None:
    """No nvpmodel on this board: the known-good state is the hardware's own limits."""
    root = emulated_agx.root
    (root / "etc/nvpmodel.conf").unlink()
    (root / "var/lib/nvpmodel/status").unlink()
    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    boot = knob_state(ctl)  # a fresh tree: every core online, DVFS wide open, EMC unlocked
    ctl.apply(LOW)
    _tear(state / BASELINE_FILE, text)  # power cut while the dead daemon held LOW

    report = restore_baseline(root, state)
    assert report.found and report.ok and report.restored, report.problems
    assert report.source == "hardware limits"
    assert report.set_aside is not None and report.set_aside.read_text() == text
    assert report.set_aside.name.startswith("baseline.json.corrupt-")
    assert str(report.set_aside) in str(report) and "known-good state" in str(report)
    assert not (state / BASELINE_FILE).exists()
    # railgate: the boot default (1) is part of the known-good state too
    assert knob_state(ctl) == boot
    assert emulated_agx.rejected_writes == []


def test_torn_baseline_returns_the_board_to_the_nvpmodel_mode_in_force(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    root = emulated_agx.root
    (root / "var/lib/nvpmodel/status").write_text("pmode:0001 fmode:quiet\n")  # 15 W mode
    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    ctl.apply(MID)
    saved = json.loads((state / BASELINE_FILE).read_text())
    assert saved["nvpmodel"] == {"id": 1, "name": "MODE_15W", "source": "/var/lib/nvpmodel/status"}
    _tear(state / BASELINE_FILE, '{"version": 1, "onl')

    report = restore_baseline(root, state)
    assert report.ok, report.problems
    assert report.source == "nvpmodel mode 1 (MODE_15W)"
    cpu = root / "sys/devices/system/cpu"
    assert [(cpu / f"cpu{n}/online").read_text().strip() for n in range(1, 12)] == [
        "1",
        "1",
        "1",
        "0",
        "0",
        "0",
        "0",
        "0",
        "0",
        "0",
        "0",
    ]
    assert (cpu / "cpufreq/policy0/scaling_max_freq").read_text().strip() == _conf_value(
        root, 1, "CPU_A78_0", "MAX_FREQ"
    )
    gpu = ctl.board.gpu_dir
    assert (gpu / "max_freq").read_text().strip() == _conf_value(root, 1, "GPU", "MAX_FREQ")
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    assert (emc / "mrq_rate_locked").read_text().strip() == "0"
    assert poll_until(lambda: emulated_agx.effective_mode().cores == 4)


def test_a_switch_after_a_torn_baseline_saves_the_known_good_state_not_the_dead_mode(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    """The bug of #10: a torn file counted as pending, so no fresh baseline was saved and the
    job's mode stayed pinned after it ended."""
    state = tmp_path / "state"
    first = controller(emulated_agx, state)
    boot = knob_state(first)
    first.apply(LOW)
    _tear(state / BASELINE_FILE, "{not json")
    del first  # crashed

    second = controller(emulated_agx, state)
    second.apply(MID)  # sets the torn file aside, goes to the known-good state, saves that
    assert list(state.glob("baseline.json.corrupt-*"))
    assert json.loads((state / BASELINE_FILE).read_text())["version"] == 1
    report = second.restore_baseline()
    assert report.ok and report.source == "saved baseline", report.problems
    assert knob_state(second) == boot  # MAXN in force = the tree's wide-open boot state


def test_a_failed_restore_names_the_file_stays_pending_and_is_retried(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    from powerd.config import parse_config
    from powerd.hardware import Hardware

    state = tmp_path / "state"
    cfg = parse_config({"device": {"root": str(emulated_agx.root)}, "state": {"dir": str(state)}})
    hw = Hardware.open(cfg)
    try:
        boot = knob_state(hw.controller)
        hw.apply(LOW)
        gpu_max = hw.controller.board.gpu_dir / "max_freq"
        keep = gpu_max.read_text()
        gpu_max.unlink()
        gpu_max.mkdir()  # a write to it now fails (EISDIR), like a kernel refusing it
        report = hw.restore()
        assert report is not None and not report.ok
        status = hw.baseline_status()
        assert status["pending"] and str(gpu_max) in str(status["restore_problem"])
        assert any(str(gpu_max) in p and "Is a directory" in p for p in report.problems)
        assert hw.restore_problem is not None and str(gpu_max) in hw.restore_problem
        assert (state / BASELINE_FILE).exists()  # kept for the retry
        assert hw.retry_restore() is None  # backing off: not yet
        gpu_max.rmdir()
        gpu_max.write_text(keep)
        retried = hw.retry_restore(now=time.monotonic() + 3600)
        assert retried is not None and retried.ok, retried and retried.problems
        assert hw.restore_problem is None and hw.retry_restore() is None
        assert knob_state(hw.controller) == boot
        assert hw.baseline_status() == {
            "pending": False,
            "restore_problem": None,
            "partial": [],
            "nvpmodel": {"id": 0, "name": "MAXN", "source": "/var/lib/nvpmodel/status"},
        }
    finally:
        hw.close()


def test_start_up_with_a_torn_baseline_restores_before_anything_else(
    emulated_agx: Emulator, tmp_path: Path
) -> None:
    from powerd.config import parse_config
    from powerd.hardware import Hardware

    state = tmp_path / "state"
    ctl = controller(emulated_agx, state)
    boot = knob_state(ctl)
    ctl.apply(LOW)
    _tear(state / BASELINE_FILE, "")
    cfg = parse_config({"device": {"root": str(emulated_agx.root)}, "state": {"dir": str(state)}})
    hw = Hardware.open(cfg)
    try:
        assert knob_state(hw.controller) == boot
        assert hw.restore_problem is None and not hw.controller.baseline.pending
        assert list(state.glob("baseline.json.corrupt-*"))
    finally:
        hw.close()


def test_offline_cluster_at_save_time_gives_a_partial_baseline(
    make_emulated_board, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster whose cores are all offline cannot be read (EBUSY on a kernel): the saved
    baseline says so, and the restore says what it set instead of the unknown values."""
    emu = make_emulated_board("orin-agx", offline_reads_fail=True)
    root = emu.root
    cpu = root / "sys/devices/system/cpu"
    policy8 = cpu / "cpufreq/policy8"
    for n in range(8, 12):
        sysfs.write_value(cpu / f"cpu{n}/online", 0)
    assert poll_until(lambda: (policy8 / "scaling_max_freq").is_dir())
    with pytest.raises(OSError):
        open(policy8 / "scaling_max_freq").read()  # noqa: SIM115 - root cannot read it either

    state = tmp_path / "state"
    ctl = controller(emu, state)
    with caplog.at_level("WARNING"):
        ctl.apply(PowerMode(12, 2201600, 1300500000, 3199000000))  # brings 8-11 online
    assert "PARTIAL" in caplog.text and "policy8" in caplog.text
    saved = json.loads((state / BASELINE_FILE).read_text())
    lim8 = next(lim for lim in saved["limits"] if lim["label"].endswith("policy8"))
    assert lim8["min"] is None and lim8["max"] is None
    assert ctl.baseline.saved_unreadable == [lim8["label"]]  # for `powerctl status`
    assert (policy8 / "scaling_max_freq").read_text().strip() == "2201600"

    report = ctl.restore_baseline()
    assert report.ok, report.problems
    assert len(report.partial) == 1 and "policy8" in report.partial[0]
    assert "unreadable at save time" in str(report) and "not put back as saved" in str(report)
    assert (cpu / "online").read_text().strip() == "0-7"
    assert poll_until(lambda: (policy8 / "scaling_max_freq").is_dir())  # offline again
    emu.set_offline_reads_fail(False)
    # not left at the job's pin: the known-good state (MAXN: no cap) for the unknown values
    assert (policy8 / "scaling_max_freq").read_text().strip() == (
        policy8 / "cpuinfo_max_freq"
    ).read_text().strip()


def test_memory_only_baseline(emulated_nano: Emulator) -> None:
    ctl = controller(emulated_nano, None)
    before = knob_state(ctl)
    ctl.apply(PowerMode(2, 268800, 306000000, 665600000))
    assert ctl.baseline.pending and ctl.baseline.path is None
    assert ctl.restore_baseline().restored
    assert knob_state(ctl) == before and not ctl.baseline.pending
