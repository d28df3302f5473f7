"""The emulated inference job that benchmarks move across goals (`InferenceClient`), against
the stand-in daemon: arrivals follow the rate it is set to whether or not powerd is told,
a told rate reaches the daemon, a latency change registers the workload again, and each
request's latency is measured from its arrival to the end of its batch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from powerd.sim.fake_daemon import FakeDaemon, FakeDecision
from powerd.sim.gpu import Gpu, idle_power
from powerd.sim.inference_job import InferenceClient, load_batch_traces
from powerd.sim.trace import TRACE_DIR
from tests.waiting import poll_until

SCALE = 0.5


@pytest.fixture(scope="module")
def batches():
    return load_batch_traces(TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv", (4, 16))


@pytest.fixture
def gpu(emulated_agx, batches):
    return Gpu(emulated_agx, idle_power(batches[4]), time_scale=SCALE)


@pytest.fixture
def endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/powerd.sock"


def _rate(client: InferenceClient, t0: float, t1: float) -> float:
    """Arrivals per trace second in [t0, t1]."""
    n = sum(t0 <= a <= t1 for a in client.arrivals)
    return n / ((t1 - t0) / SCALE)


def test_goal_changes_move_the_arrivals_and_reach_the_daemon(gpu, batches, endpoint) -> None:
    told = {40.0 / SCALE: FakeDecision(16)}  # the rate on the wall clock
    fake = FakeDaemon(endpoint, FakeDecision(batch_size=4), on_rate=told)
    with (
        fake,
        InferenceClient(
            gpu, batches, 20.0, budget_w=20, latency_ms=2000, workload="w", endpoint=endpoint
        ) as client,
    ):
        t0 = time.monotonic()
        time.sleep(1.5)
        assert _rate(client, t0 + 0.2, time.monotonic()) == pytest.approx(20.0, rel=0.15)
        served = client.since(t0)
        assert served and {q.batch_size for q in served} == {4}
        # latency from arrival to the end of the batch: at least the batch's traced time
        t_inf = batches[4].lookup(gpu.emulator.effective_mode()).time_ms
        lat = [(q.end - q.arrival) / SCALE * 1000.0 for q in served]
        assert min(lat) >= 0.9 * t_inf
        assert max(lat) <= 3 / 20.0 * 1000.0 + 1.5 * t_inf + 100.0

        # a drift: the arrivals double, powerd is not told
        client.set_rate(40.0, tell=False)
        t1 = time.monotonic()
        time.sleep(1.5)
        assert _rate(client, t1 + 0.2, time.monotonic()) == pytest.approx(40.0, rel=0.15)
        assert not any(q.batch_size == 16 for q in client.since(t1))

        # told: the daemon's decision for that rate (b=16) reaches the batches
        client.set_rate(40.0)
        assert poll_until(lambda: any(q.batch_size == 16 for q in client.since(t1)), 5.0)

        # a latency change is a new registration of the same workload with the new target
        client.set_latency(1000.0)
        assert [r.latency_ms for r in fake.registers] == [2000 * SCALE, 1000 * SCALE]
        assert {r.workload for r in fake.registers} == {"w"}
        assert fake.registers[-1].rate_hz == pytest.approx(40.0 / SCALE)
    assert client.error is None
