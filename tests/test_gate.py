"""The GPU gate's ordering rules, on their own (the daemon runs it on the request path)."""

from __future__ import annotations

import pytest

from powerd import protocol as p
from powerd.client import _FastPath
from powerd.gate import GateFlag, GpuGate
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


def test_a_larger_batch_is_bounded_by_its_own_size_not_the_smaller_ones_before_it() -> None:
    g, posted = _gate()  # timeout 1 s
    t = 0.0
    for i in range(4):  # batches of 4 that run 20 ms: the bound at b=4 is 80 ms
        g.enter("inf", "inference", ReplyTo(0, b"i", i), t, size=4)
        g.leave("inf", t + 0.02)
        t += 0.1
    assert g.hold_limit("inf", 4) == pytest.approx(0.08)
    # powerd moved the job to b=64: a batch of 64 runs 300 ms; before any was seen its
    # bound is the b=4 one scaled by 64/4 (1.28 s, capped at the timeout), so the batch
    # is not cut at four of the small ones while the other job waits
    assert g.hold_limit("inf", 64) == pytest.approx(1.0)
    for i in range(3):
        g.enter("inf", "inference", ReplyTo(0, b"i", 10 + i), t, size=64)
        g.enter("tr", "training", ReplyTo(0, b"t", 10 + i), t + 0.001)
        g.check(t + 0.2, {"tr", "inf"}, managed=True)
        assert g.holder == "inf", "a 300 ms batch of 64 was cut at 200 ms"
        g.leave("inf", t + 0.3)
        assert g.holder == "tr"
        g.leave("tr", t + 0.35)
        t += 1.0
    assert g.preempted == 0
    # its own holds now bound it (4 x 300 ms), and a hung batch of 64 is cut there
    assert g.hold_limit("inf", 64) == pytest.approx(1.0)  # 1.2 s, capped at the timeout
    assert g.hold_limit("inf", 16) == pytest.approx(0.32)  # nearest seen: b=4 x 16/4


def test_a_job_that_left_while_waiting_is_not_granted_afterwards() -> None:
    g, posted = _gate()
    g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0)
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 2), 0.1) is None
    g.leave("inf", 0.2)  # its client stopped waiting, ran the batch and left
    g.enter("tr", "training", ReplyTo(0, b"t", 3), 0.3)
    assert g.holder == "tr" and not posted


# ---- the fast path: a training job steps without a round trip while nobody waits -----------


@pytest.fixture
def fast(tmp_path):
    """A gate with its flag file, and the training client's read-only view of it."""
    g, posted = _gate()
    endpoint = f"ipc://{tmp_path}/powerd.sock"
    g.flag = GateFlag(f"{tmp_path}/powerd.sock.gate-flag")
    yield g, posted, lambda job: _FastPath.open(endpoint, job)
    g.flag.close()


def test_a_training_job_alone_on_the_gate_steps_without_asking_until_a_batch_comes(fast) -> None:
    g, posted, view = fast
    assert isinstance(g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0), p.GateOpen)
    tr, other = view("tr"), view("tr2")
    assert tr.mine() and not other.mine()
    assert g.busy_until() is None  # nothing to cut: it may step for as long as nobody asks
    g.check(5.0, {"tr", "inf"}, managed=True)  # far past the 1 s timeout
    assert g.holder == "tr" and g.timeouts == 0 and tr.mine()
    # a batch comes: the flag is cleared at once; the batch waits for the step in flight
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 2), 5.01) is None
    assert not tr.mine() and g.holder == "tr"
    # the trainer's next step() sees it and asks: the batch goes first
    assert g.enter("tr", "training", ReplyTo(0, b"t", 3), 5.02) is None
    assert g.holder == "inf" and [r.job for _, r in posted] == ["inf"] and not tr.mine()
    # the batch ends: the trainer is let in, back on the fast path
    g.leave("inf", 5.03)
    assert g.holder == "tr" and posted[-1][1].job == "tr" and tr.mine()


def test_a_trainer_that_pauses_on_the_fast_path_is_cut_after_a_few_of_its_step_times(fast) -> None:
    g, posted, view = fast
    g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0)
    g.note_steps("tr", [0.02] * 5)  # its client reports 20 ms steps
    assert g.hold_limit("tr") == pytest.approx(0.08)
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 2), 3.0) is None
    assert g.busy_until() == pytest.approx(3.08)  # bounded from when the batch came
    g.check(3.05, {"tr", "inf"}, managed=True)
    assert g.holder == "tr"
    g.check(3.081, {"tr", "inf"}, managed=True)
    assert g.holder == "inf" and g.preempted == 1 and not view("tr").mine()
    # the trainer resumes: it asks, and waits for the batch
    assert g.enter("tr", "training", ReplyTo(0, b"t", 3), 3.1) is None
    g.leave("inf", 3.11)
    assert g.holder == "tr" and view("tr").mine()


def test_the_fast_path_closes_when_the_gate_stops_managing_or_the_trainer_is_gone(fast) -> None:
    g, _, view = fast
    g.enter("tr", "training", ReplyTo(0, b"t", 1), 0.0)
    assert view("tr").mine()
    g.check(0.1, {"tr"}, managed=False)
    assert not view("tr").mine() and g.holder is None
    g.check(0.2, {"tr"}, managed=True)
    g.enter("tr", "training", ReplyTo(0, b"t", 2), 0.3)
    assert view("tr").mine()
    g.check(0.4, {"inf"}, managed=True)  # its client died
    assert not view("tr").mine() and g.holder is None


def test_a_flag_left_by_a_crashed_daemon_is_not_read_as_the_new_one(tmp_path) -> None:
    path = f"{tmp_path}/powerd.sock.gate-flag"
    old = GateFlag(path)
    old.open_for("tr")
    seen = _FastPath.open(f"ipc://{tmp_path}/powerd.sock", "tr")
    assert seen.mine() and seen.current("tr")
    new = GateFlag(path)  # the next daemon makes its own file; the old mapping still reads
    assert not seen.current("tr") and not seen.current("tr2")
    fresh = _FastPath.open(f"ipc://{tmp_path}/powerd.sock", "tr")
    assert not fresh.mine()
    new.open_for("tr")
    assert fresh.mine()
    new.close()
    assert not fresh.mine()


def test_the_gate_says_when_an_inference_batch_starts_and_how_long_its_last_ones_took():
    posted: list[tuple[ReplyTo, p.BaseModel]] = []
    told: list[tuple[float, float | None]] = []
    g = GpuGate(
        lambda to, r: posted.append((to, r)), 1.0, on_batch=lambda t, d: told.append((t, d))
    )
    g.check(0.0, set(), managed=True)
    for k, held in enumerate([0.010, 0.030, 0.020]):
        t = 1.0 + k
        assert isinstance(g.enter("inf", "inference", ReplyTo(0, b"i", k), t, size=4), p.GateOpen)
        g.leave("inf", t + held)
    assert told == [(1.0, None), (2.0, None), (3.0, None)]  # too few batches seen to tell
    g.enter("inf", "inference", ReplyTo(0, b"i", 9), 4.0, size=4)
    assert told[-1] == (4.0, pytest.approx(0.020))  # the median of its size's batches
    g.leave("inf", 4.02)
    g.enter("inf", "inference", ReplyTo(0, b"i", 10), 5.0, size=16)
    assert told[-1] == (5.0, None)  # another size: its own batches, none yet
    g.leave("inf", 5.1)
    # a training step is not a batch; a batch granted later, when the step leaves, is told then
    assert isinstance(g.enter("tr", "training", ReplyTo(0, b"t", 11), 6.0), p.GateOpen)
    assert g.enter("inf", "inference", ReplyTo(0, b"i", 12), 6.01, size=4) is None
    assert told[-1][0] == 5.0
    g.leave("tr", 6.05)
    assert told[-1] == (6.05, pytest.approx(0.020))


def test_a_failing_batch_hook_does_not_stop_the_gate() -> None:
    def broken(t: float, d: float | None) -> None:
        raise OSError("sampler gone")

    g = GpuGate(lambda to, r: None, 1.0, on_batch=broken)
    g.check(0.0, set(), managed=True)
    assert isinstance(g.enter("inf", "inference", ReplyTo(0, b"i", 1), 1.0, size=1), p.GateOpen)
    assert g.holder == "inf"
