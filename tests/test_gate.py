"""The GPU gate's ordering rules, on their own (the daemon runs it on the request path)."""

from __future__ import annotations

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
