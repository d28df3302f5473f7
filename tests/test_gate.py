"""The GPU gate's ordering rules, on their own (the daemon runs it on the request path)."""

from __future__ import annotations

import pytest

from powerd import protocol as p
from powerd.gate import GpuGate
from powerd.registry import ReplyTo


def _gate():
    posted: list[tuple[ReplyTo, p.BaseModel]] = []
    g = GpuGate(lambda to, reply: posted.append((to, reply)), timeout_s=1.0)
    g.check(0.0, set(), managed=True)
    return g, posted


def test_a_waiting_batch_goes_before_the_next_training_step() -> None:
    g, posted = _gate()
    assert isinstance(g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0), p.GateOpen)
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 2), 0.01) is None  # waits
    # the training job steps again (enter ends its hold): the batch runs first
    assert g.enter("tr", "training", ReplyTo(0, b"t", 3), 0.02) is None
    assert [r.job for _, r in posted] == ["inf"] and g.holder == "inf"
    g.leave("inf", 0.05)
    assert [r.job for _, r in posted] == ["inf", "tr"] and g.holder == "tr"
    assert [h[0] for h in g.holds] == ["tr", "inf"]


def test_a_holder_that_is_gone_or_late_loses_the_slot() -> None:
    g, posted = _gate()
    g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0)
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 2), 0.1) is None
    g.check(0.5, {"tr", "inf"}, managed=True)
    assert g.holder == "tr"  # within the timeout
    g.check(1.2, {"tr", "inf"}, managed=True)
    assert g.holder == "inf" and g.timeouts == 1
    g.enter("tr", "training", ReplyTo(0, b"t", 3), 1.3)
    g.check(1.4, {"tr"}, managed=True)  # the inference client died holding it
    assert g.holder == "tr" and posted[-1][1].job == "tr"


def test_an_unmanaged_gate_opens_at_once_and_releases_waiters() -> None:
    g, posted = _gate()
    g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0)
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 2), 0.1) is None
    g.check(0.2, {"tr", "inf"}, managed=False)
    assert [r.job for _, r in posted] == ["inf"]
    assert isinstance(g.enter("inf", "inference", ReplyTo(0, b"i", 3), 0.3), p.GateOpen)


def test_a_pause_while_holding_hands_the_gpu_to_a_waiting_job_after_a_few_of_its_steps() -> None:
    g, posted = _gate()  # timeout (heartbeat) 1 s
    t = 0.0
    for i in range(5):  # training steps of 20 ms, back to back
        g.enter("tr", "training", ReplyTo(0, b"t", i), t)
        t += 0.02
    t -= 0.02  # the last step's hold started here
    assert g.holder == "tr" and g.hold_limit("tr") == pytest.approx(0.08)
    # the trainer pauses holding the GPU (evaluation); a batch comes
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 9), t + 0.01) is None
    assert g.busy_until() == pytest.approx(t + 0.08)
    g.check(t + 0.05, {"tr", "inf"}, managed=True)
    assert g.holder == "tr"  # within 4 steps' time: a slow step, not a pause
    g.check(t + 0.081, {"tr", "inf"}, managed=True)
    assert g.holder == "inf" and posted[-1][1].job == "inf" and g.preempted == 1
    # nobody waits: a long hold is only ended by the timeout
    g.leave("inf", t + 0.1)
    g.enter("tr", "training", ReplyTo(0, b"t", 10), t + 0.2)
    g.check(t + 0.9, {"tr", "inf"}, managed=True)
    assert g.holder == "tr"


def test_a_hung_batch_is_bounded_by_its_own_batch_times_and_unknown_jobs_by_the_timeout() -> None:
    g, posted = _gate()
    # no history yet: the bound is the timeout
    g.enter("inf", "inference", ReplyTo(0, b"i", 1), 0.0)
    g.enter("tr", "training", ReplyTo(0, b"t", 2), 0.01)
    g.check(0.5, {"tr", "inf"}, managed=True)
    assert g.holder == "inf"
    g.check(1.01, {"tr", "inf"}, managed=True)
    assert g.holder == "tr" and g.timeouts == 1
    g.leave("tr", 1.02)
    t = 1.1
    for i in range(4):  # batches of 5 ms: 4 x 5 ms = 20 ms (over the 10 ms floor)
        g.enter("inf", "inference", ReplyTo(0, b"i", 10 + i), t)
        g.leave("inf", t + 0.005)
        t += 0.1
    assert g.hold_limit("inf") == pytest.approx(0.02)
    g.enter("inf", "inference", ReplyTo(0, b"i", 20), t)  # ... and hangs in batch()
    g.enter("tr", "training", ReplyTo(0, b"t", 21), t + 0.001)
    g.check(t + 0.021, {"tr", "inf"}, managed=True)
    assert g.holder == "tr" and posted[-1][1].job == "tr"


def test_a_job_that_left_while_waiting_is_not_granted_afterwards() -> None:
    g, posted = _gate()
    g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0)
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 2), 0.1) is None
    g.leave("inf", 0.2)  # its client stopped waiting, ran the batch and left
    g.enter("tr", "training", ReplyTo(0, b"t", 3), 0.3)
    assert g.holder == "tr" and not posted
