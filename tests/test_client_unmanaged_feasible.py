"""`job.feasible` says whether no mode meets the job's goal (False) or that nothing is
decided for it (None). A job powerd does not manage (the daemon stopped answering, or no
daemon with required=False) reads None, as a job the daemon released does, not the True of
a pin it no longer holds. (An admin's restore: tests/test_external_change.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import powerd
from powerd.sim.fake_daemon import FakeDaemon, FakeDecision


def test_a_job_whose_daemon_stops_answering_reads_nothing_decided(tmp_path: Path) -> None:
    with FakeDaemon(f"ipc://{tmp_path}/powerd.sock", FakeDecision(feasible=True)) as fake:
        with powerd.request(budget_w=15, workload="w", endpoint=fake.endpoint) as job:
            deadline = time.monotonic() + 3
            while job.feasible is not True:
                assert time.monotonic() < deadline, job.phase
                job.step()
                time.sleep(0.02)
            fake.frozen = True  # the daemon stops answering
            deadline = time.monotonic() + 5
            while job.message != "powerd is not answering":
                assert time.monotonic() < deadline, job.phase
                job.step()
                time.sleep(0.05)
            assert job.phase == "idle" and job.mode is None
            assert job.feasible is None and job.fastest_ms is None
            fake.frozen = False  # it answers again: the daemon's verdict is back
            deadline = time.monotonic() + 5
            while job.feasible is not True:
                assert time.monotonic() < deadline, (job.phase, job.message)
                job.step()
                time.sleep(0.05)


def test_a_training_job_without_a_daemon_reads_nothing_decided() -> None:
    endpoint = "ipc:///nonexistent/powerd.sock"
    job = powerd.request(budget_w=15, workload="w", required=False, endpoint=endpoint)
    assert job.phase == "idle" and job.feasible is None
    inf = powerd.request(kind="inference", rate_hz=30, required=False, endpoint=endpoint)
    assert inf.feasible is True  # InferenceJob.feasible: a bool, True until told otherwise


def test_a_job_without_a_daemon_has_every_attribute_a_managed_job_has() -> None:
    """A script written for a daemon reads job.fastest_ms or job.step_time_ms: without one
    (required=False) it read AttributeError (found by a tester)."""
    endpoint = "ipc:///nonexistent/powerd.sock"
    for cls, args in (
        (powerd.Job, {}),
        (powerd.InferenceJob, {"kind": "inference", "rate_hz": 30}),
    ):
        job = powerd.request(budget_w=15, required=False, endpoint=endpoint, **args)
        missing = [a for a in dir(cls) if not a.startswith("_") and not hasattr(job, a)]
        assert not missing, (cls.__name__, missing)
    timed = powerd.request(step_time_ms=120, workload="w", required=False, endpoint=endpoint)
    assert timed.objective == "step_time" and timed.step_time_ms == 120
    assert timed.fastest_ms is None and timed.id is None
