"""tools/demo (powerd.sim.demo): which trace it replays, and how it refuses a bad combination."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from powerd.sim import demo, harness
from powerd.sim.harness import EmulatedBoard
from powerd.sim.trace import TRACE_DIR, Trace

AGX_TRAIN = TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv"
NANO_TRAIN = TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv"
AGX_INFER = TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Trace]:
    """The traces the demo would start a board with (none is started)."""
    seen: list[Trace] = []

    def fake_start(board: str, trace: Trace, *_a: object) -> None:
        seen.append(trace)

    monkeypatch.setattr(demo, "_start_board", fake_start)
    return seen


@pytest.fixture
def scratch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(harness, "scratch_dir", lambda: str(tmp_path))
    return tmp_path


def test_each_board_replays_its_own_trace_by_default(started: list[Trace]) -> None:
    demo.main(["--board", "orin-nano"])
    demo.main([])
    assert [t.name for t in started] == [NANO_TRAIN.stem, AGX_TRAIN.stem]


def test_batch_size_picks_the_inference_rows(started: list[Trace]) -> None:
    demo.main(["--trace", str(AGX_INFER), "--batch-size", "4"])
    assert np.array_equal(started[0].time_ms, Trace.load(AGX_INFER, batch_size=4).time_ms)
    assert not np.array_equal(started[0].time_ms, Trace.load(AGX_INFER).time_ms)


def test_a_trace_the_board_cannot_hold_is_a_one_line_usage_error(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = demo.main(["--board", "orin-nano", "--trace", str(AGX_TRAIN)])
    out = capsys.readouterr()
    assert rc == 2
    assert out.err.count("\n") == 1
    assert "more cores than orin-nano has" in out.err and "Traceback" not in out.err
    assert list(scratch.iterdir()) == []  # no temporary tree left behind


def test_an_unloadable_trace_or_batch_size_is_a_usage_error(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--trace", str(scratch / "nope.csv")]) == 2
    assert "cannot load trace" in capsys.readouterr().err
    assert demo.main(["--trace", str(AGX_INFER), "--batch-size", "3"]) == 2
    assert "batch size 3 not in" in capsys.readouterr().err


def test_a_board_that_fails_to_start_removes_its_temporary_tree(scratch: Path) -> None:
    board = EmulatedBoard("orin-nano", Trace.load(AGX_TRAIN))
    with pytest.raises(ValueError, match="more cores"), board:
        pass
    assert not board.dir.exists()
    assert list(scratch.iterdir()) == []


def test_a_board_whose_config_is_refused_removes_its_temporary_tree(scratch: Path) -> None:
    # the emulated sysfs tree is made in memory before the config is checked
    work = scratch / "work"
    with pytest.raises(Exception, match="unknown_key"):
        EmulatedBoard("orin-nano", Trace.load(NANO_TRAIN), workdir=work, config={"unknown_key": {}})
    assert [p.name for p in scratch.iterdir()] == []  # neither the tree nor anything else


def test_a_relative_workdir_is_taken_from_the_current_directory(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(scratch)
    board = EmulatedBoard("orin-nano", Trace.load(NANO_TRAIN), workdir="w")
    try:
        assert board.dir == scratch / "w" and board.endpoint == f"ipc://{scratch}/w/powerd.sock"
    finally:
        board.stop()
