"""When the daemon stops answering, the job turns idle before it reads disconnected: a reader
that sees `connected` False also sees phase idle and no mode (a CI run read 'profiling'
between the two)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from powerd import protocol as p
from powerd.client import Job


def test_a_job_reads_idle_by_the_time_it_reads_disconnected(monkeypatch) -> None:
    conn = SimpleNamespace(endpoint="ipc:///x/powerd.sock", last_reply=0.0, close=lambda: None)
    state = p.JobState(job="j1", phase="profiling", budget_w=20, mode=None, heartbeat_ms=100)
    job = Job(conn, state)  # type: ignore[arg-type]
    seen = []

    def on_warning(msg, *args, **kwargs) -> None:
        # the warning is the first thing the user sees: the job's state at that moment
        seen.append((job.connected, job.phase, job.message))

    monkeypatch.setattr(logging.getLogger("powerd.client"), "warning", on_warning)
    job._flush(now=100.0)  # silent for 100 s
    assert seen, "no warning about the silent daemon"
    assert seen[0] == (False, "idle", "powerd is not answering")
    assert job.feasible is None and job.mode is None
