"""`powerctl pareto` without `--kind inference` for a workload that has only inference pairs:
the not-found answer says so and how to ask, instead of pointing at a training job."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from powerd.cli import ctl_main
from powerd.sim.harness import EmulatedBoard
from powerd.sim.trace import Trace
from powerd.store import Store


@pytest.fixture
def board(trace: Trace) -> Iterator[EmulatedBoard]:
    with EmulatedBoard("orin-agx", trace, time_scale=0.03, strategy="binary-search") as b:
        yield b


def _seed_pairs(eb: EmulatedBoard, trace: Trace, name: str, n: int) -> None:
    d = Store(eb.state_dir).workload_dir(eb.status()["board_key"], name)
    d.mkdir(parents=True, exist_ok=True)
    rows = [
        {**r.mode.as_dict(), "batch_size": 4, "batch_ms": 20.0, "power_w": r.power_w}
        for r in trace.rows[:n]
    ]
    (d / "inference.json").write_text(json.dumps({"format": 1, "pairs": rows}))


def test_pareto_of_an_inference_workload_without_kind_says_to_ask_with_kind_inference(
    board: EmulatedBoard, trace: Trace, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    _seed_pairs(board, trace, "r18-infer", 3)
    monkeypatch.setenv("POWERD_ENDPOINT", board.endpoint)
    assert ctl_main(["pareto", "--workload", "r18-infer"]) == 1
    err = capsys.readouterr().err
    assert "no fitted predictor for workload 'r18-infer'" in err
    assert (
        "'r18-infer' has 3 measured inference pairs: ask for its front with "
        "`powerctl pareto --workload r18-infer --kind inference --rate R`"
    ) in err
    assert "powertrain" not in err
    # a name nothing is known of keeps the training hint
    assert ctl_main(["pareto", "--workload", "never-ran"]) == 1
    err = capsys.readouterr().err
    assert "a job with strategy powertrain fits one" in err and "inference" not in err
