"""python -m powerd.sim: builds a tree, prints its root, emulates until SIGTERM."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from powerd.device.detect import detect_board
from powerd.device.power import PowerReader
from powerd.sim import __main__ as sim_main
from powerd.sim.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def test_cli_runs_until_sigterm(sim_root: Path) -> None:
    root = sim_root / "board"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powerd.sim",
            "--board",
            "orin-nano",
            "--root",
            str(root),
            "--time-scale",
            "0.1",
            "--seed",
            "3",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert Path(line) == root.absolute()
        assert detect_board(root).name == "orin-nano"
        deadline = time.monotonic() + 5
        while PowerReader(root).read_w() < 1.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert PowerReader(root).read_w() > 5.0  # the emulator is writing power
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_a_bad_trace(sim_root: Path, capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sim_main, "scratch_dir", lambda: str(tmp_path))
    assert main(["--trace", str(sim_root / "nope.csv")]) == 2
    assert "cannot load trace" in capsys.readouterr().err
    assert main(["--reuse"]) == 2  # --reuse needs --root
    assert "--reuse needs --root" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # a refused run leaves no tree behind


def test_a_tree_of_its_own_is_removed_when_the_emulator_stops(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """Without --root the tree goes to scratch_dir (/dev/shm: memory) and must not outlive
    the emulator."""
    monkeypatch.setattr(sim_main, "scratch_dir", lambda: str(tmp_path))
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def stop_once_serving() -> None:
        # SIGTERM only once main's handler is in place: before that it would end pytest
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]:
                time.sleep(0.2)  # let it print its root
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    stopper = threading.Thread(target=stop_once_serving, daemon=True)
    stopper.start()
    try:
        assert main(["--board", "orin-nano", "--time-scale", "0.1"]) == 0
    finally:
        stopper.join(timeout=5)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    printed = Path(capsys.readouterr().out.strip())
    assert printed.parent == tmp_path and printed.name.startswith("powerd-sim-orin-nano-")
    assert list(tmp_path.iterdir()) == []
