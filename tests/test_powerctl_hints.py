"""What powerctl tells a user to do next must work as typed, and what it says is wrong must be
what is wrong (user-testing pass: the predict hint for an inference workload; an inference
job held over its power budget that read like a missed latency target)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest

from powerd.cli import ctl_main, format_status
from powerd.sim.harness import EmulatedBoard
from powerd.sim.trace import Trace
from tests.inference_seed import seed_pairs


@pytest.fixture
def board(trace: Trace) -> Iterator[EmulatedBoard]:
    with EmulatedBoard("orin-agx", trace, time_scale=0.03, strategy="binary-search") as b:
        yield b


def test_the_predict_hint_for_an_inference_workload_is_a_command_that_works(
    board: EmulatedBoard, trace: Trace, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """`powerctl predict --workload ut7-det` said "ask with --kind inference --rate R", and
    `powerctl predict ... --kind inference --rate 30` is a usage error (predict has no such
    options): the hint names the pareto command, and that command answers."""
    seed_pairs(board, trace, "ut7-det", 7)
    monkeypatch.setenv("POWERD_ENDPOINT", board.endpoint)
    assert ctl_main(["predict", "--workload", "ut7-det"]) == 1
    err = capsys.readouterr().err
    command = "powerctl pareto --workload ut7-det --kind inference --rate R"
    assert "'ut7-det' has 7 measured inference pairs" in err and command in err, err
    # the hint typed with a rate works
    argv = shlex.split(command.replace(" R", " 30"))[1:]
    assert ctl_main([*argv, "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)


# ---- powerctl status: why an inference job is infeasible ----------------------------------


def _inference_job(**fields: object) -> dict[str, object]:
    job: dict[str, object] = {
        "id": "j1",
        "kind": "inference",
        "workload": "ut7-det",
        "budget_w": 5.0,
        "objective": "power_budget",
        "phase": "tuned",
        "feasible": False,
        "steps": 120,
        "profiled_modes": 0,
        "message": "",
        "batch_size": 4,
        "latency_ms": 300.0,
        "rate_hz": 30.0,
        "p99_latency_ms": 4.8,
        "best_latency_ms": 4.6,
        "queue_grows": False,
        "pairs_profiled": 6,
    }
    job.update(fields)
    return job


def _status(job: dict[str, object]) -> dict[str, object]:
    return {
        "board": "Jetson AGX Orin",
        "l4t": "36.4",
        "strategy": "binary-search",
        "mode_space_size": 100,
        "mode": None,
        "power_w": 6.1,
        "budget_w": job["budget_w"],
        "default_budget_w": 30.0,
        "limits_w": {"min": 5.0, "max": 80.0},
        "jobs": [job],
    }


def _detail(job: dict[str, object]) -> str:
    lines = format_status(_status(job)).splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.lstrip().startswith("j1 "))
    return lines[i + 1]


@pytest.mark.parametrize("queue_grows", [False, True])
def test_an_inference_job_over_its_power_budget_reads_as_a_budget_problem(
    queue_grows: bool,
) -> None:
    """The daemon holds the least-power pair measured when no pair stays within the budget
    (phase idle, feasible False: README "Using it"). The line read "latency target 300.0 ms,
    measured p99 4.8 ms, ... INFEASIBLE (best 4.6 ms)": a latency problem that is none (or
    "queue grows" when the least-power pair cannot keep up either)."""
    job = _inference_job(
        phase="idle",
        queue_grows=queue_grows,
        message="no measured (mode, batch size) pair stays within the budget",
    )
    detail = _detail(job)
    assert "INFEASIBLE: no pair within the 5 W budget" in detail, detail
    assert "best 4.6 ms" not in detail and "queue grows" not in detail, detail


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # pairs within the budget exist, none meets the latency target: best is that latency
        ({"best_latency_ms": 412.0, "p99_latency_ms": 420.0}, "INFEASIBLE (best 412.0 ms)"),
        ({"queue_grows": True}, "INFEASIBLE (queue grows)"),
    ],
)
def test_an_inference_job_within_its_budget_keeps_the_latency_reasons(
    fields: dict[str, object], expected: str
) -> None:
    detail = _detail(_inference_job(**fields))
    assert expected in detail and "budget" not in detail, detail


def test_the_daemon_reports_an_inference_job_over_its_budget_as_powerctl_reads_it(
    tmp_path,
) -> None:
    """Through the real daemon: at 5 W no ResNet-18 pair of the trace stays within the
    budget; the status says so (phase idle, feasible False) and the line reads it."""
    from powerd.sim.gpu import Gpu, idle_power
    from powerd.sim.inference_job import InferenceClient, load_batch_traces
    from powerd.sim.trace import TRACE_DIR
    from tests.waiting import poll_until

    scale = 0.5
    batches = load_batch_traces(TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv", (4, 16))
    eb = EmulatedBoard(
        "orin-agx",
        batches[4],
        time_scale=scale,
        workdir=tmp_path,
        config={"inference": {"max_pairs": 3}, "profiling": {"min_steps": 3}},
    )
    with eb:
        gpu = Gpu(eb.emulator, idle_power(batches[4]), time_scale=scale)
        with InferenceClient(
            gpu,
            batches,
            15.0,
            budget_w=5.0,
            latency_ms=300.0,
            workload="ut7-det",
            endpoint=eb.endpoint,
        ) as client:
            seen: dict = {}

            def reported() -> bool:
                seen["status"] = eb.status()
                job = next(j for j in seen["status"]["jobs"] if j["id"] == client.job_id)
                return job["feasible"] is False

            assert poll_until(reported, 60.0, period_s=0.1), eb.log_tail()
    text = format_status(seen["status"])
    assert "INFEASIBLE: no pair within the 5 W budget" in text, text
    assert "INFEASIBLE (" not in text, text
