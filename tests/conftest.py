"""Shared pytest fixtures. Each section belongs to the part of powerd it serves."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from powerd.sim.emulator import Emulator
from powerd.sim.memfs import scratch_dir
from powerd.sim.trace import TRACE_DIR, Trace
from powerd.sim.tree import build_tree

# ---- emulated boards (powerd.sim) -------------------------------------------------------
# A board is a file tree in tmp_path plus a running Emulator thread that reacts to writes
# like a kernel. time_scale 0.1: cur files follow a write in 1-3 ms and power settles with
# a 30 ms time constant, so tests stay fast while every reaction is still asynchronous.

EMULATOR_TIME_SCALE = 0.1
AGX_TRACE = TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv"
NANO_TRACE = TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv"


@pytest.fixture(scope="session")
def agx_trace() -> Trace:
    return Trace.load(AGX_TRACE)


@pytest.fixture(scope="session")
def nano_trace() -> Trace:
    return Trace.load(NANO_TRACE)


@pytest.fixture(scope="session")
def trace(agx_trace: Trace) -> Trace:
    """The default workload of the daemon tests: MobileNet v3 training on Orin AGX."""
    return agx_trace


@pytest.fixture(scope="session")
def resnet_pairs():
    """ResNet-18 inference on Orin AGX over (mode, batch size): the in-sample inference trace."""
    from powerd_replay.inference import PairTrace

    return PairTrace.load(TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv")


@pytest.fixture(scope="session")
def mobilenet_pairs():
    """MobileNet v3 inference on Orin AGX over (mode, batch size): held out of all tuning."""
    from powerd_replay.inference import PairTrace

    return PairTrace.load(TRACE_DIR / "orin_agx_mobilenetv3_gld23k_infer.csv")


EmulatorFactory = Callable[..., Emulator]


@pytest.fixture
def sim_root(tmp_path: Path) -> Iterator[Path]:
    """An empty directory for emulated file trees: on tmpfs when there is one (like sysfs,
    and much faster to fill and delete than the ext4 /tmp here), removed after the test."""
    if scratch_dir() != "/dev/shm":
        (tmp_path / "sim").mkdir()
        yield tmp_path / "sim"
        return
    root = Path(tempfile.mkdtemp(prefix="powerd-sim-", dir="/dev/shm"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_emulated_board(
    sim_root: Path, agx_trace: Trace, nano_trace: Trace
) -> Iterator[EmulatorFactory]:
    """Factory: make_emulated_board("orin-agx", start=True, trace=None, root=None,
    l4t=None, hwmon_index=None, **Emulator kwargs) -> Emulator. Every emulator it made is
    stopped at teardown."""
    made: list[Emulator] = []
    traces = {"orin-agx": agx_trace, "orin-nano": nano_trace}

    def make(
        board: str = "orin-agx",
        *,
        start: bool = True,
        trace: Trace | None = None,
        root: Path | None = None,
        l4t: str | None = None,
        hwmon_index: int | None = None,
        **kwargs: object,
    ) -> Emulator:
        trace = trace or traces[board]
        root = root or sim_root / f"{board}-{len(made)}"
        seed = int(kwargs.pop("seed", 0))  # type: ignore[call-overload]
        build_tree(root, board, trace, l4t=l4t, seed=seed, hwmon_index=hwmon_index)
        kwargs.setdefault("time_scale", EMULATOR_TIME_SCALE)
        emu = Emulator(root, board, trace, seed=seed, **kwargs)  # type: ignore[arg-type]
        made.append(emu)
        return emu.start() if start else emu

    yield make
    for emu in made:
        emu.stop()


@pytest.fixture
def emulated_agx(make_emulated_board: EmulatorFactory) -> Emulator:
    """A running emulated Orin AGX (JetPack 5 layout, MobileNet v3 training trace)."""
    return make_emulated_board("orin-agx")


@pytest.fixture
def emulated_nano(make_emulated_board: EmulatorFactory) -> Emulator:
    """A running emulated Orin Nano (JetPack 6 layout, ResNet-18 training trace)."""
    return make_emulated_board("orin-nano")
