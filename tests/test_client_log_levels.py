"""What the client writes into the user's training log: a job's progress messages are INFO
(one line per probe as a WARNING flooded long jobs' logs), problems stay WARNING."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import powerd
from powerd.sim.fake_daemon import FakeDaemon, FakeDecision


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDaemon]:
    with FakeDaemon(f"ipc://{tmp_path}/powerd.sock", FakeDecision()) as f:
        yield f


def _messages(fake: FakeDaemon, caplog, decision: FakeDecision) -> list[logging.LogRecord]:
    fake.decision = decision
    caplog.set_level(logging.INFO, logger="powerd.client")
    job = powerd.request(budget_w=15, workload="w", endpoint=fake.endpoint)
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any(
            decision.message in r.getMessage() for r in caplog.records
        ):
            job.step()
            time.sleep(0.02)
    finally:
        job.close()
    return [r for r in caplog.records if decision.message in r.getMessage()]


def test_progress_messages_are_info_not_warnings(fake: FakeDaemon, caplog) -> None:
    msg = "measuring a candidate mode while tuned (3 so far)"
    records = _messages(fake, caplog, FakeDecision(phase="profiling", message=msg))
    assert records and all(r.levelno == logging.INFO for r in records), records
    assert len(records) == 1  # once per distinct message


def test_a_budget_that_cannot_be_met_is_a_warning(fake: FakeDaemon, caplog) -> None:
    msg = "no measured mode fits 5 W: holding the lowest-power mode measured"
    records = _messages(fake, caplog, FakeDecision(phase="idle", feasible=False, message=msg))
    assert records and records[0].levelno == logging.WARNING, records
