"""`powerctl pareto` without `--kind inference` for a workload that has only inference pairs:
the not-found answer says so and how to ask, instead of pointing at a training job."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from powerd.cli import ctl_main
from powerd.sim.harness import EmulatedBoard
from powerd.sim.trace import Trace
from tests.inference_seed import seed_pairs


@pytest.fixture
def board(trace: Trace) -> Iterator[EmulatedBoard]:
    with EmulatedBoard("orin-agx", trace, time_scale=0.03, strategy="binary-search") as b:
        yield b


def test_pareto_of_an_inference_workload_without_kind_says_to_ask_with_kind_inference(
    board: EmulatedBoard, trace: Trace, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    seed_pairs(board, trace, "r18-infer", 3)
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
