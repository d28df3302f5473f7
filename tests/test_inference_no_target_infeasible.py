"""An inference job without a latency target whose queue cannot drain under the budget, through
the real daemon: it is served within the budget, with the most requests per second measured,
and reported infeasible (the daemon once failed formatting that report: "unsupported format
string passed to NoneType")."""

from __future__ import annotations

import pytest

from powerd.sim.gpu import Gpu, idle_power
from powerd.sim.harness import EmulatedBoard
from powerd.sim.inference_job import InferenceClient, load_batch_traces
from powerd.sim.trace import TRACE_DIR
from tests.waiting import poll_until

SCALE = 0.5
RATE, BUDGET = 200.0, 17.0  # pairs under 17 W exist, and none of them drains 200/s


@pytest.fixture(scope="module")
def batches():
    return load_batch_traces(TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv", (4, 16))


def test_no_target_and_no_queue_that_drains_is_reported_not_a_crash(batches, tmp_path) -> None:
    # the harness keeps the emulated sysfs tree in memory (tmpfs) whatever the workdir
    eb = EmulatedBoard(
        "orin-agx",
        batches[4],
        time_scale=SCALE,
        workdir=tmp_path,
        config={"inference": {"max_pairs": 3}, "profiling": {"min_steps": 3}},
    )
    with eb:
        gpu = Gpu(eb.emulator, idle_power(batches[4]), time_scale=SCALE)
        with InferenceClient(
            gpu,
            batches,
            RATE,
            budget_w=BUDGET,
            latency_ms=None,
            workload="flood",
            endpoint=eb.endpoint,
        ) as client:
            seen: dict = {}

            def reported() -> bool:
                job = next(j for j in eb.status()["jobs"] if j["id"] == client.job_id)
                seen["job"] = job
                return job["phase"] in ("tuned", "idle") and job["feasible"] is False

            assert poll_until(reported, 60.0, period_s=0.1), (seen, eb.log_tail())
            job = seen["job"]
            # no latency is bounded when the queue grows: the message says what is served
            # (the daemon's clock: the trace's 200/s at time scale 0.5)
            assert f"keeps up with {RATE / SCALE:g} requests/s: serving the most" in job["message"]
            assert job["queue_grows"] and job["best_latency_ms"] is not None
            # served within the budget on the trace's truth
            b = job["batch_size"]
            from powerd.modes import PowerMode

            mode = PowerMode(**eb.status()["mode"])
            assert batches[b].lookup(mode).power_w <= BUDGET + 0.5
            # what profiling cost is reported per inference workload, as for training
            cost = eb.status()["inference_profiling"]["flood"]
            assert cost["modes_measured"] == job["pairs_profiled"]
            assert cost["seconds"] > 0 and 0.0 <= cost["share_above_budget_1w"] <= 1.0
        log = eb.daemon_log.read_text()
    assert "internal error" not in log
