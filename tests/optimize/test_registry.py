"""make_strategy, and the replay tool's command line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from powerd.optimize import STRATEGIES, BinarySearch, PowerTrain, make_strategy
from powerd.sim.trace import Trace
from powerd_replay.training import GridSpace

REPO = Path(__file__).resolve().parents[2]


def test_registry_builds_each_strategy(nano: Trace) -> None:
    space = GridSpace.from_trace(nano)
    assert set(STRATEGIES) == {"powertrain", "binary-search"}
    bs = make_strategy("binary-search", space, max_modes=50)
    assert isinstance(bs, BinarySearch) and bs.name == "binary-search"
    assert bs.max_probes == 12
    assert make_strategy("binary-search", space, max_modes=8).max_probes == 8
    pt = make_strategy("powertrain", space, max_modes=30, seed_share=0.2)
    assert isinstance(pt, PowerTrain) and pt.name == "powertrain"
    assert pt.max_modes == 30 and pt.n_seeds == 6
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("simulated-annealing", space)
    with pytest.raises(TypeError):
        make_strategy("powertrain", space, no_such_knob=1)


def _replay_tool():
    spec = importlib.util.spec_from_file_location(
        "strategy_replay", REPO / "tools/strategy_replay.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


NANO = str(REPO / "powerd/sim/traces/orin_nano_resnet18_imagenet_train.csv")


def test_replay_tool_prints_a_table(capsys) -> None:
    tool = _replay_tool()
    assert tool.main(["--strategy", "binary-search", "--trace", NANO, "--seeds", "0,1"]) == 0
    out = capsys.readouterr().out
    assert "== binary-search on orin_nano_resnet18_imagenet_train" in out
    assert out.count("\n  ") >= 13  # a row per budget, 8..20 W
    assert "median penalty" in out and "distinct modes" in out


def test_replay_tool_prints_a_row_per_step_time_target(capsys) -> None:
    tool = _replay_tool()
    args = ["--strategy", "binary-search", "--trace", NANO, "--seeds", "0", "--step-time"]
    assert tool.main(args) == 0
    out = capsys.readouterr().out
    # a target row: target, mode, time, power, least, regular, excess, met, modes
    rows = [r for r in out.splitlines() if len(r.split()) == 9 and r.split()[7] in ("yes", "NO")]
    summary = next(line for line in out.splitlines() if "step-time targets" in line)
    n_targets = int(summary.split("step-time targets")[1].split(":")[0])
    assert n_targets >= 5 and len(rows) == n_targets
    # --summary: the aggregates only
    assert tool.main([*args, "--summary"]) == 0
    assert capsys.readouterr().out.count("\n") == 1
