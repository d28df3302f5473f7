"""The inference client API (InferenceJob, batch gate) against a tiny fake daemon."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import powerd
from powerd.sim.fake_daemon import FakeDaemon, FakeDecision


@pytest.fixture
def endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/powerd.sock"


def test_request_sends_the_contract_fields_and_exposes_the_decision(endpoint: str) -> None:
    with FakeDaemon(endpoint, FakeDecision(batch_size=16)) as fake:
        inf = powerd.request(
            kind="inference",
            budget_w=15,
            latency_ms=100,
            rate_hz=30,
            workload="yolov8n-coco",
            batch_sizes=(1, 4, 16, 32, 64),
            endpoint=endpoint,
        )
        try:
            assert isinstance(inf, powerd.InferenceJob)
            reg = fake.registers[0]
            assert reg.kind == "inference" and reg.batch_sizes == [1, 4, 16, 32, 64]
            assert (reg.latency_ms, reg.rate_hz, reg.budget_w) == (100, 30, 15)
            assert inf.batch_size == 16
            assert inf.feasible is True and inf.best_latency_ms is None
        finally:
            inf.close()


def test_set_rate_applies_the_new_decision(endpoint: str) -> None:
    worse = FakeDecision(batch_size=4, feasible=False, best_latency_ms=250.0)
    with FakeDaemon(endpoint, FakeDecision(batch_size=16), on_rate={45.0: worse}):
        with powerd.request(
            kind="inference", budget_w=15, latency_ms=100, rate_hz=30, endpoint=endpoint
        ) as inf:
            inf.set_rate(45)
            assert inf.batch_size == 4
            assert inf.feasible is False
            assert inf.best_latency_ms == 250.0


def test_open_gate_reports_batches_without_gate_traffic(endpoint: str) -> None:
    with FakeDaemon(endpoint, FakeDecision(batch_size=2)) as fake:
        with powerd.request(kind="inference", rate_hz=30, endpoint=endpoint) as inf:
            for _ in range(3):
                with inf.batch(size=inf.batch_size):
                    time.sleep(0.01)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and sum(len(s.d) for s in fake.steps) < 3:
                time.sleep(0.02)
        durations = [d for s in fake.steps for d in s.d]
        assert len(durations) == 3 and all(0.009 < d < 0.5 for d in durations)
        assert fake.gate_log == []


def test_managed_gate_waits_until_the_slot_is_free(endpoint: str) -> None:
    decision = FakeDecision(batch_size=4, gate="managed", gate_timeout_ms=3000)
    with FakeDaemon(endpoint, decision) as fake:
        with powerd.request(kind="inference", rate_hz=30, endpoint=endpoint) as inf:
            fake.hold_gate()  # a training step in flight
            threading.Timer(0.15, fake.release_gate).start()
            t0 = time.monotonic()
            with inf.batch(size=4) as b:
                entered = time.monotonic() - t0
            assert 0.12 <= entered < 1.0
            assert b.waited_s == pytest.approx(entered, abs=0.05)
            # With the slot free, entering is a single round trip.
            with inf.batch(size=4) as b2:
                pass
            assert b2.waited_s < 0.1
        ops = [(op, size) for _, _, op, size in fake.gate_log]
        assert ops == [("enter", 4), ("leave", 4), ("enter", 4), ("leave", 4)]


def test_gate_wait_is_bounded_by_the_gate_timeout(endpoint: str) -> None:
    decision = FakeDecision(batch_size=1, gate="managed", gate_timeout_ms=300)
    with FakeDaemon(endpoint, decision) as fake:
        with powerd.request(kind="inference", rate_hz=30, endpoint=endpoint) as inf:
            fake.frozen = True  # the daemon stops answering
            t0 = time.monotonic()
            with inf.batch():
                pass
            waited = time.monotonic() - t0
            fake.frozen = False
            assert 0.25 <= waited < 1.0
            assert inf._gate.timeouts == 1
            # A later batch ignores the stale answer and gets its own.
            with inf.batch() as b:
                pass
            assert b.waited_s < 0.25


def test_noop_job_has_the_inference_api() -> None:
    job = powerd.request(
        kind="inference", rate_hz=30, required=False, endpoint="ipc:///nonexistent/x.sock"
    )
    assert job.feasible is True and job.best_latency_ms is None and job.batch_size == 1
    with job.batch(size=1):
        pass
    job.set_rate(10)
