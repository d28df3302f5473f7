"""Training and inference on one board through the real daemon, client and emulated GPU:
joining and leaving in every order, the GPU gate, and a client that dies holding it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from waiting import first_true

import powerd
from powerd.cli import format_status
from powerd.sim.gpu import Gpu, idle_power
from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.inference_job import load_batch_traces, run_inference_job
from powerd.sim.job import run_training_job
from powerd.sim.trace import TRACE_DIR, Trace

SCALE = 0.2
BUDGET = 20.0
HEARTBEAT_MS = 1500  # the harness's heartbeat timeout


@pytest.fixture(scope="module")
def batches():
    return load_batch_traces(TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv", (1, 4, 16))


@pytest.fixture(scope="module")
def train_trace():
    return Trace.load(TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv")


@pytest.fixture
def board(batches, tmp_path):
    eb = EmulatedBoard(
        "orin-agx",
        batches[1],
        time_scale=SCALE,
        workdir=tmp_path,
        config={"inference": {"max_pairs": 6}},
    )
    with eb:
        yield eb, Gpu(eb.emulator, idle_power(batches[1]), time_scale=SCALE)


def _phase_of(eb, kind: str) -> str | None:
    jobs = [j for j in eb.status()["jobs"] if j["kind"] == kind]
    return jobs[0]["phase"] if jobs else None


def _measures(eb, marker: str) -> list[str]:
    """Lines of the daemon log after `marker` that report a new measurement."""
    text = eb.daemon_log.read_text()
    tail = text[text.index(marker) :] if marker in text else ""
    return [
        ln
        for ln in tail.splitlines()
        if re.search(r"measured .* b=\d+|interleaved probe|profil(ing|ed) mode", ln)
    ]


def _switch_ms(eb, kind: str) -> float | None:
    """Daemon log time from a job of `kind` closing to the next mode applied (the switch)."""
    from datetime import datetime

    def at(line: str) -> datetime:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")

    lines = eb.daemon_log.read_text().splitlines()
    ids = {ln.split("job ")[1].split()[0] for ln in lines if "registered: workload" in ln}
    for i, ln in enumerate(lines):
        if "ended: closed" in ln and any(j in ln for j in ids):
            for nxt in lines[i + 1 :]:
                if "applied" in nxt:
                    return (at(nxt) - at(ln)).total_seconds() * 1000.0
    return None


def _serve(eb, gpu, batches, duration_s: float, **kw):
    """ResNet-18 inference at 10/s, 3 s target and the board's budget, through the client
    (the goal in wall-clock units): the inference job these tests join and leave."""
    return run_inference_job(
        gpu,
        batches,
        10.0,
        duration_s=duration_s,
        budget_w=BUDGET,
        latency_ms=3000,
        endpoint=eb.endpoint,
        wall_clock_goal=True,
        **kw,
    )


def _windows_accounted(eb) -> int:
    """Every inference window the daemon logged, interleaved probes included, counted
    towards the workload's profiling cost in status: how many there were."""
    log = eb.daemon_log.read_text()
    windows = len(re.findall(r"interleaved probe .* b=\d+|inference: job \w+: measured ", log))
    costs = eb.status().get("inference_profiling") or {}
    assert sum(c["modes_measured"] for c in costs.values()) == windows, (costs, windows)
    return windows


class _Stop(Exception):
    pass


class _Trainer:
    """A training job on the emulated GPU in a thread, until `stop()` (or `max_s`)."""

    def __init__(self, eb, trace, gpu, max_s: float = 60.0, on_step=None):
        self.stop_event = threading.Event()
        self.steps = 0

        def hook(job, run) -> None:
            self.steps = run.steps
            if on_step is not None:
                on_step(job, run)
            if self.stop_event.is_set():
                raise _Stop  # leaves the job's `with` block: the job closes

        def target() -> None:
            try:
                run_training_job(
                    eb.root,
                    trace,
                    BUDGET,
                    "mobilenet",
                    SCALE,
                    endpoint=eb.endpoint,
                    stay_tuned_s=1000,
                    max_s=max_s,
                    gpu=gpu,
                    on_step=hook,
                )
            except _Stop:
                pass

        self.thread = threading.Thread(target=target)
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)


def test_training_then_inference_joins_and_leaves_first(board, batches, train_trace) -> None:
    eb, gpu = board
    _seed(eb, batches, ("emulated-inference",), train_trace)
    before = knob_snapshot(eb.root)
    trainer = _Trainer(eb, train_trace, gpu)
    assert first_true(lambda: _phase_of(eb, "training") == "tuned", 20), eb.log_tail()
    alone = eb.status()["mode"]
    seen: dict = {}

    def on_batch(inf, run) -> None:
        if inf.phase == "tuned" and "st" not in seen:
            seen["st"] = eb.status()
        if inf.phase == "tuned":
            seen["tuned_batches"] = seen.get("tuned_batches", 0) + 1
            if seen["tuned_batches"] == 20:
                seen["later"] = eb.status()

    run = _serve(eb, gpu, batches, 70, on_batch=on_batch)
    left = time.monotonic()
    assert "st" in seen, eb.log_tail()
    st = seen["st"]
    assert st["planner"] == "interleave"
    inf_job = next(j for j in st["jobs"] if j["kind"] == "inference")
    assert inf_job["interleaved"] is True and inf_job["batch_size"] in (1, 4, 16)
    assert run.feasible is True
    # powerctl status: the measured worst case while interleaved (was "n/a": the
    # inference side alone had served no pair), the batch fill and a training step on top
    # of the p99 batch time
    later = next(j for j in seen["later"]["jobs"] if j["kind"] == "inference")
    assert later["interleaved"] is True
    assert later["p99_latency_ms"] is not None, later
    b, rate = later["batch_size"], later["rate_hz"]
    assert later["p99_latency_ms"] > (b - 1) * 1000.0 / rate + later["p99_batch_ms"]
    assert "measured p99 n/a" not in format_status(seen["later"])
    # both ran on the GPU while interleaved; a batch never waited long at the gate
    assert max(run.gate_waits_s) <= HEARTBEAT_MS / 1000.0
    # the inference job left: training is back at the mode it was tuned to alone, with
    # no new profiling
    back = first_true(
        lambda: eb.status()["planner"] == "training" and eb.status()["mode"] == alone, 10
    )
    switch_s = time.monotonic() - left
    assert back, eb.log_tail()
    assert first_true(lambda: _phase_of(eb, "training") == "tuned", 10)
    print(
        f"switch back to training-only: {switch_s * 1000:.0f} ms seen by status; "
        f"close -> mode applied in the daemon: {_switch_ms(eb, 'inference')} ms"
    )
    marker = [ln for ln in eb.daemon_log.read_text().splitlines() if "ended: closed" in ln][0]
    assert not [ln for ln in _measures(eb, marker) if "b=" not in ln]
    trainer.stop()
    assert trainer.steps > 0
    assert first_true(lambda: knob_snapshot(eb.root) == before, 8)


def test_inference_then_training_joins_and_leaves_first(board, batches, train_trace) -> None:
    eb, gpu = board
    _seed(eb, batches, ("emulated-inference",), train_trace)
    before = knob_snapshot(eb.root)
    out: dict = {}
    state: dict = {}

    def on_batch(inf, run) -> None:
        if inf.phase == "tuned" and "alone" not in state and "trainer" not in state:
            state["alone"] = (eb.status()["mode"], inf.batch_size)
            t = threading.Thread(
                target=lambda: out.setdefault(
                    "run",
                    run_training_job(
                        eb.root,
                        train_trace,
                        BUDGET,
                        "mobilenet",
                        SCALE,
                        endpoint=eb.endpoint,
                        stay_tuned_s=1000,
                        max_s=5,
                        gpu=gpu,
                    ),
                )
            )
            state["trainer"] = t
            t.start()
        if "trainer" in state and not state["trainer"].is_alive() and "left" not in state:
            state["left"] = time.monotonic()
            state["marker"] = eb.daemon_log.read_text().count("\n")
        if "left" in state and "back" not in state:
            if eb.status()["planner"] == "inference" and inf.phase == "tuned":
                state["back"] = (
                    time.monotonic() - state["left"],
                    eb.status()["mode"],
                    inf.batch_size,
                )

    run = _serve(eb, gpu, batches, 75, on_batch=on_batch)
    assert "trainer" in state, eb.log_tail()
    state["trainer"].join()
    assert "run" in out and out["run"].steps > 0
    assert "back" in state, eb.log_tail()
    switch_s, mode, b = state["back"]
    print(f"switch back to inference-only: {switch_s * 1000:.0f} ms")
    # back to an inference-only decision from the pairs already measured (the alone pick,
    # or a pair the interleaved probes measured that serves with less power), within budget
    from powerd.modes import PowerMode

    assert batches[b].lookup(PowerMode(**mode)).power_w <= BUDGET + 0.5
    lines = eb.daemon_log.read_text().splitlines()[state["marker"] :]
    assert not [ln for ln in lines if re.search(r"measured .* b=\d+", ln)]
    assert run.feasible is True
    assert first_true(lambda: knob_snapshot(eb.root) == before, 8)


_DYING_TRAINER = textwrap.dedent(
    """
    import sys, time, powerd
    job = powerd.request(budget_w=20, workload="dying", endpoint=sys.argv[1])
    while True:
        job.step()  # under managed interleaving: takes the GPU and keeps it
        print(job._state.gate, flush=True)
        time.sleep(0.05 if job._state.gate != "managed" else 3600)
    """
)


def test_a_client_dying_while_it_holds_the_gpu_blocks_the_other_at_most_a_heartbeat(
    board,
) -> None:
    eb, _ = board
    inf = powerd.request(
        kind="inference",
        budget_w=BUDGET,
        rate_hz=50.0,
        latency_ms=2000,
        endpoint=eb.endpoint,
        batch_sizes=(1, 4),
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, "-c", _DYING_TRAINER, eb.endpoint],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        # wait until the trainer holds the GPU under the managed gate
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.strip() == "managed":
                break
        assert first_true(lambda: inf._state.gate == "managed", 5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        with inf.batch(size=inf.batch_size) as handle:
            pass
        waited = time.monotonic() - t0
        assert handle.waited_s <= waited
        assert waited <= HEARTBEAT_MS / 1000.0 + 0.5
        # and the board goes back to inference alone
        assert first_true(lambda: eb.status()["planner"] == "inference", 5)
    finally:
        if proc.poll() is None:
            proc.kill()
        inf.close()


def test_training_then_inference_and_training_leaves_first(board, batches, train_trace) -> None:
    eb, gpu = board
    _seed(eb, batches, ("emulated-inference",), train_trace)
    state: dict = {}
    trainer = _Trainer(eb, train_trace, gpu, max_s=9)
    assert first_true(lambda: _phase_of(eb, "training") == "tuned", 8), eb.log_tail()

    def on_batch(inf, run) -> None:
        if inf._state.gate == "managed":
            state["managed"] = True
        if not trainer.is_alive() and "alone" not in state:
            if eb.status()["planner"] == "inference" and inf._state.gate == "open":
                state["alone"] = time.monotonic()

    run = _serve(eb, gpu, batches, 65, on_batch=on_batch)
    trainer.thread.join()
    assert state.get("managed"), eb.log_tail()
    assert trainer.steps > 0
    # the training job left first: inference alone again, through the open gate
    assert "alone" in state, eb.log_tail()
    assert run.requests > 0 and run.latencies_ms


def test_inference_then_training_and_inference_leaves_first(board, batches, train_trace) -> None:
    eb, gpu = board
    _seed(eb, batches, ("emulated-inference",), train_trace)
    out: dict = {}
    inf_thread = threading.Thread(
        target=lambda: out.setdefault(
            "inf",
            _serve(eb, gpu, batches, 40),
        )
    )
    inf_thread.start()
    assert first_true(lambda: _phase_of(eb, "inference") is not None, 5)
    time.sleep(1.0)
    seen: dict = {}

    def on_step(job, run) -> None:
        if job._state.gate == "managed":
            seen["managed"] = True
        if not inf_thread.is_alive() and job._state.gate == "open" and job.phase == "tuned":
            seen.setdefault("alone_tuned", eb.status()["planner"])
            raise _Stop  # seen: the training job may end

    trainer = _Trainer(eb, train_trace, gpu, max_s=25, on_step=on_step)
    trainer.thread.join()
    inf_thread.join()
    assert seen.get("managed"), eb.log_tail()
    # the inference job left first: training continues alone, tuned by the training planner
    assert seen.get("alone_tuned") == "training", eb.log_tail()
    assert trainer.steps > 0 and out["inf"].latencies_ms


def _seed(eb, batches, names, train=None, extra_w: float = 0.0) -> None:
    """Store measurements for inference workloads `names` and the training workload
    "mobilenet" (the traces' values on the wall clock, as the daemon would have measured
    them): workloads profiled before are served from what was measured, so these tests
    spend their time on joining and leaving, not on profiling (which the emulated clients
    cannot time finely on a loaded machine). Every pair is stored: a job of a workload
    profiled on a few modes would first cover the rate axis at its budget."""
    import json

    from powerd.optimize.base import Measurement
    from powerd.store import Store

    key = eb.status()["board_key"]
    store = Store(eb.state_dir)
    modes = sorted({r.mode for r in batches[4].rows})
    if train is not None:  # every mode: the training search has nothing left to measure
        store.save_samples(
            key,
            "mobilenet",
            {r.mode: Measurement(r.mode, r.time_ms * SCALE, r.power_w, 20) for r in train.rows},
        )
    rows = []
    for mode in modes:
        for b in sorted(batches):
            row = batches[b].lookup(mode)
            rows.append(
                {
                    **mode.as_dict(),
                    "batch_size": b,
                    "batch_ms": row.time_ms * SCALE,
                    "batch_p99_ms": row.time_ms * SCALE * 1.05,
                    "power_w": row.power_w + extra_w,
                    "batches": 20,
                }
            )
    for name in names:
        d = store.workload_dir(key, name)
        d.mkdir(parents=True, exist_ok=True)
        (d / "inference.json").write_text(json.dumps({"format": 1, "pairs": rows}))


def _tuner(eb) -> dict:
    return eb.status().get("tuner") or {}


def test_two_inference_jobs_then_training_joins_and_leaves_first(board, batches, train_trace):
    """Two inference jobs share the GPU (one mode, a batch size each); a training job joins
    (the three share it, training gets what the batches leave) and leaves first (the two
    inference jobs go back to sharing it alone, from their measured pairs)."""
    eb, gpu = board
    before = knob_snapshot(eb.root)
    _seed(eb, batches, ("inf-a", "inf-b"), train_trace)
    served = {b: t for b, t in batches.items() if b >= 4}
    runs: dict = {}
    seen: dict = {}
    threads = [
        threading.Thread(
            target=lambda n=n, r=r: runs.setdefault(
                n,
                run_inference_job(
                    gpu,
                    served,
                    r,
                    duration_s=70,
                    budget_w=BUDGET,
                    latency_ms=5000,
                    workload=f"inf-{n}",
                    endpoint=eb.endpoint,
                    wall_clock_goal=True,
                    seed=n,
                ),
            )
        )
        # slack: b=4 batches every 2-2.7 s (trace) leave room for a training step between
        for n, r in (("a", 2.0), ("b", 1.5))
    ]
    for t in threads:
        t.start()
    two = first_true(
        lambda: _tuner(eb).get("state") == "tuned" and len(_tuner(eb).get("jobs") or []) == 2, 8
    )
    assert two, eb.log_tail()
    marker = eb.daemon_log.read_text().count("\n")

    def on_step(job, run) -> None:
        d = _tuner(eb) if "three" not in seen else {}
        # the shared (joint) decision; at the join the status may still show the inference
        # side's previous one-job shape for a tick, which has no "jobs"
        if d.get("planner") == "interleave" and d.get("state") == "tuned" and "jobs" in d:
            seen.setdefault("three", d)

    tr = run_training_job(
        eb.root,
        train_trace,
        BUDGET,
        "mobilenet",
        SCALE,
        endpoint=eb.endpoint,
        stay_tuned_s=1.5,
        # the joint decision reads tuned once the batches beside training are measured
        # (1.5 s after the training job's own tuned in one CI run): stay long enough
        run_after_tuned_s=6,
        max_s=15,
        gpu=gpu,
        on_step=on_step,
    )
    assert "three" in seen, eb.log_tail()
    three = seen["three"]
    assert len(three["jobs"]) == 2 and three["training_job"] is not None
    assert three["throughput_bound_hz"] is not None and three["throughput_bound_hz"] > 0
    assert tr.steps > 0
    # the training job left first: the two inference jobs share the GPU again, re-solved from
    # what is measured (no inference pair measured after the training job left)
    back = first_true(
        lambda: (
            eb.status()["planner"] == "inference"
            and _tuner(eb).get("state") == "tuned"
            and len(_tuner(eb).get("jobs") or []) == 2
        ),
        6,
    )
    assert back, eb.log_tail()
    # powerctl status: each shared job's measured worst case, its batch fill plus the p99
    # of both jobs' batches (it may wait behind the other's)

    def shared_worst() -> list[dict] | None:
        jobs = [j for j in eb.status()["jobs"] if j["kind"] == "inference"]
        return jobs if all(j.get("p99_latency_ms") is not None for j in jobs) else None

    assert first_true(shared_worst, 20), [j for j in eb.status()["jobs"]]
    jobs = shared_worst() or []
    p99_sum = sum(j["p99_batch_ms"] for j in jobs)
    for j in jobs:
        fill = (j["batch_size"] - 1) * 1000.0 / j["rate_hz"]
        assert j["p99_latency_ms"] == pytest.approx(fill + p99_sum, rel=0.25), j
    left_at = eb.daemon_log.read_text().splitlines()[marker:]
    i = next(k for k, ln in enumerate(left_at) if "ended: closed" in ln)
    assert not [ln for ln in left_at[i:] if re.search(r"measured .* b=\d+", ln)]
    for t in threads:
        t.join()
    for n in ("a", "b"):
        assert runs[n].feasible is True and runs[n].latencies_ms
        assert max(runs[n].gate_waits_s) <= HEARTBEAT_MS / 1000.0
    assert first_true(lambda: knob_snapshot(eb.root) == before, 8)


_PAUSING_TRAINER = textwrap.dedent(
    """
    import sys, time, powerd
    job = powerd.request(budget_w=20, workload="pausing", endpoint=sys.argv[1])
    n = 0
    while True:
        job.step()  # under managed interleaving: gives the GPU back, takes it again
        n += job._state.gate == "managed"
        if n == 30:
            print("pausing", flush=True)
            time.sleep(3600)  # evaluation or a checkpoint, holding the GPU; heartbeats go on
        time.sleep(0.02)  # the step's work
    """
)

_HANGING_BATCH = textwrap.dedent(
    """
    import sys, time, powerd
    inf = powerd.request(kind="inference", budget_w=20, rate_hz=50, latency_ms=2000,
                         workload="hanging", endpoint=sys.argv[1], batch_sizes=(1, 4))
    while inf._state.gate != "managed":
        time.sleep(0.02)
    with inf.batch(size=inf.batch_size):
        print("inside", flush=True)
        time.sleep(3600)
    """
)


def _spawn(script: str, endpoint: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.Popen(
        [sys.executable, "-c", script, endpoint], stdout=subprocess.PIPE, env=env, text=True
    )


def test_a_training_job_pausing_while_it_holds_the_gpu_delays_a_batch_a_few_steps(board):
    eb, _ = board
    inf = powerd.request(
        kind="inference",
        budget_w=BUDGET,
        rate_hz=50.0,
        latency_ms=2000,
        endpoint=eb.endpoint,
        batch_sizes=(1, 4),
    )
    proc = _spawn(_PAUSING_TRAINER, eb.endpoint)
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.strip() == "pausing":
                break
        assert first_true(lambda: inf._state.gate == "managed", 5)
        time.sleep(0.05)
        t0 = time.monotonic()
        with inf.batch(size=inf.batch_size) as handle:
            pass
        waited = time.monotonic() - t0
        # the trainer is alive (its heartbeats go on): the gate hands the GPU over after a
        # few of its step times, not after the heartbeat timeout
        assert proc.poll() is None
        assert handle.waited_s <= waited < 0.5 * HEARTBEAT_MS / 1000.0, waited
        assert first_true(lambda: "handed over" in eb.daemon_log.read_text(), 3)
        # and the next batch does not wait behind the pause again
        with inf.batch(size=inf.batch_size) as again:
            pass
        assert again.waited_s < 0.5 * HEARTBEAT_MS / 1000.0
    finally:
        proc.kill()
        proc.wait()
        inf.close()


def test_an_inference_client_killed_inside_a_batch_blocks_training_at_most_a_heartbeat(board):
    eb, _ = board
    job = powerd.request(budget_w=BUDGET, workload="waiting-trainer", endpoint=eb.endpoint)
    proc = _spawn(_HANGING_BATCH, eb.endpoint)
    try:
        assert first_true(lambda: job.step() or job._state.gate == "managed", 10)
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.strip() == "inside":
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        job.step()  # ends this job's hold: the dead client's batch holds the GPU
        job.step()  # waits for the GPU
        waited = time.monotonic() - t0
        assert waited <= HEARTBEAT_MS / 1000.0 + 0.5, waited
        # the dead job is dropped: training alone again, through the open gate
        assert first_true(lambda: eb.status()["planner"] == "training", 5)
    finally:
        if proc.poll() is None:
            proc.kill()
        job.close()


def test_training_steps_without_asking_while_no_batch_waits_and_asks_when_one_does(board):
    """The gate's fast path: with an inference job registered but no batch waiting, a
    training step() reads the daemon's flag and runs on; a batch that enters clears it, and
    the next step() comes to the gate and waits for the batch."""
    eb, _ = board
    job = powerd.request(budget_w=BUDGET, workload="fast-trainer", endpoint=eb.endpoint)
    inf = powerd.request(
        kind="inference",
        budget_w=BUDGET,
        rate_hz=50.0,
        latency_ms=2000,
        endpoint=eb.endpoint,
        batch_sizes=(1, 4),
        workload="idle-server",
    )
    try:
        assert first_true(lambda: job.step() or job._state.gate == "managed", 10)
        for _ in range(3):  # the first managed step asks once; the daemon opens the flag
            job.step()
            time.sleep(0.005)
        sent = job._turns.sent
        for _ in range(200):
            job.step()
            time.sleep(0.002)  # the step's work
        assert job._turns.sent == sent, "a step asked the daemon while nothing waited"
        # a batch runs; the trainer's next step asks (the flag was cleared) and is let in
        # only after the batch left
        with inf.batch(size=inf.batch_size) as handle:
            t_inside = time.monotonic()
            stepped = threading.Event()
            waiter = threading.Thread(target=lambda: (job.step(), stepped.set()))
            waiter.start()
            time.sleep(0.2)
            assert not stepped.is_set(), "a training step ran while the batch held the GPU"
        t_left = time.monotonic()
        waiter.join(5)
        assert stepped.is_set() and job._turns.sent >= sent + 1
        assert handle.waited_s < 0.5 and t_left - t_inside >= 0.2
        # and once let in, it is back on the fast path
        sent = job._turns.sent
        for _ in range(50):
            job.step()
            time.sleep(0.002)
        assert job._turns.sent == sent
    finally:
        inf.close()
        job.close()


def test_an_inference_job_that_runs_no_batch_leaves_training_in_its_own_mode(
    batches, train_trace, tmp_path
) -> None:
    """A serving process registers at start-up and waits for requests: until its first
    batch the training job keeps its training-only mode (no joint probe moves the board),
    with the gate managed already; its first batch starts the interleaving. When its
    batches stop for `rate_drift_s` (a server idle at night), training has its mode back."""
    eb = EmulatedBoard(
        "orin-agx",
        batches[1],
        time_scale=SCALE,
        workdir=tmp_path,
        config={"inference": {"max_pairs": 6, "rate_drift_s": 2.0}},
    )
    with eb:
        gpu = Gpu(eb.emulator, idle_power(batches[1]), time_scale=SCALE)
        _seed(eb, batches, ("emulated-inference",), train_trace)
        trainer = _Trainer(eb, train_trace, gpu)
        try:
            assert first_true(lambda: _phase_of(eb, "training") == "tuned", 20), eb.log_tail()
            alone = eb.status()["mode"]
            marker = eb.daemon_log.read_text().count("\n")
            inf = powerd.request(
                kind="inference",
                budget_w=BUDGET,
                rate_hz=10.0,
                latency_ms=3000,
                workload="emulated-inference",
                batch_sizes=(1, 4, 16),
                endpoint=eb.endpoint,
            )
            try:
                assert first_true(lambda: eb.status()["planner"] == "interleave", 5)
                for _ in range(6):  # ~3 s: several of the daemon's windows
                    time.sleep(0.5)
                    _assert_training_alone(eb, alone)
                ij = next(j for j in eb.status()["jobs"] if j["kind"] == "inference")
                assert ij["phase"] == "profiling" and "no batches reported yet" in ij["message"]
                assert inf.batch_size == 1  # the smallest size: nothing measured together
                lines = eb.daemon_log.read_text().splitlines()[marker:]
                assert not [ln for ln in lines if "interleaved probe" in ln or "interleaving" in ln]
                # the first batches: the joint solve starts
                for _ in range(10):
                    with inf.batch(size=inf.batch_size):
                        time.sleep(0.01)
                    time.sleep(0.1)
                assert first_true(
                    lambda: "ran a batch: interleaving it" in eb.daemon_log.read_text(), 5
                ), eb.log_tail()
                # the status follows at the end of that control tick (after the joint solve
                # it starts), not with the log line
                assert first_true(lambda: not eb.status()["tuner"].get("waiting_for_batches"), 5), (
                    eb.log_tail()
                )
                # while batches keep coming (past rate_drift_s) the interleaving holds
                t_end = time.monotonic() + 3.0
                while time.monotonic() < t_end:
                    with inf.batch(size=inf.batch_size):
                        time.sleep(0.01)
                    time.sleep(0.1)
                    assert not eb.status()["tuner"].get("waiting_for_batches"), eb.log_tail()
                # the batches stop: after rate_drift_s (2 s) training has its mode back
                assert first_true(lambda: eb.status()["tuner"].get("waiting_for_batches"), 8), (
                    eb.log_tail()
                )
                assert first_true(lambda: eb.status()["mode"] == alone, 5), eb.log_tail()
                _assert_training_alone(eb, alone)
                ij = next(j for j in eb.status()["jobs"] if j["kind"] == "inference")
                assert re.search(r"no batch for \d+ s", ij["message"]), ij
            finally:
                inf.close()
        finally:
            trainer.stop()


def _assert_training_alone(eb, alone) -> None:
    st = eb.status()
    assert st["mode"] == alone, eb.log_tail()
    tr = next(j for j in st["jobs"] if j["kind"] == "training")
    assert tr["phase"] == "tuned", tr
    assert st["planner"] == "interleave" and st["tuner"]["waiting_for_batches"]
    assert st["tuner"]["state"] == "waiting for batches", st["tuner"]


def test_two_idle_inference_jobs_both_say_they_run_no_batches(board, batches, train_trace):
    """With two inference jobs that run no batches, training has the GPU in its own mode;
    the second job read "another inference job interleaves", which nothing did."""
    eb, gpu = board
    _seed(eb, batches, ("emulated-inference",), train_trace)
    trainer = _Trainer(eb, train_trace, gpu)
    jobs = []
    try:
        assert first_true(lambda: _phase_of(eb, "training") == "tuned", 20), eb.log_tail()
        alone = eb.status()["mode"]
        for rate in (10.0, 20.0):
            jobs.append(
                powerd.request(
                    kind="inference",
                    budget_w=BUDGET,
                    rate_hz=rate,
                    latency_ms=3000,
                    workload="emulated-inference",
                    batch_sizes=(1, 4, 16),
                    endpoint=eb.endpoint,
                )
            )
        assert first_true(lambda: eb.status()["planner"] == "interleave", 5)
        time.sleep(1.0)
        st = eb.status()
        _assert_training_alone(eb, alone)
        inf = [j for j in st["jobs"] if j["kind"] == "inference"]
        assert len(inf) == 2
        for j in inf:
            assert j["phase"] == "profiling", j
            assert "no batches reported yet" in j["message"], j
        assert all(job.batch_size == 1 for job in jobs)
    finally:
        for job in jobs:
            job.close()
        trainer.stop()


PROBE_LINE = re.compile(
    r"interleaved probe (\d+)c/cpu (\d+) MHz/gpu (\d+) MHz/emc (\d+) MHz b=(\d+): "
    r"batch p99 [\d.]+ ms at ([\d.]+) W \((?:(\d+) readings inside batches|too few readings[^)]*)\)"
)


def test_a_new_inference_workload_s_short_batches_are_read_inside_them(
    batches, train_trace, tmp_path
):
    """A batch (here 2-7 ms) is far shorter than the 100 ms between regular power readings:
    the gate tells the sampler when each batch starts, and a reading of its own inside it
    gives the batch's power (before: the window's highest reading, the training steps')."""
    config = {"inference": {"max_pairs": 6}, "power": {"sample_interval_ms": 100}}
    with EmulatedBoard(
        "orin-agx", batches[1], time_scale=SCALE, workdir=tmp_path, config=config
    ) as eb:
        _new_inference_workload_probes(
            eb, Gpu(eb.emulator, idle_power(batches[1]), SCALE), batches, train_trace
        )


def _new_inference_workload_probes(eb, gpu, batches, train_trace) -> None:
    _seed(eb, batches, (), train_trace)  # training known; the inference workload is new
    trainer = _Trainer(eb, train_trace, gpu)
    assert first_true(lambda: _phase_of(eb, "training") == "tuned", 20), eb.log_tail()
    _serve(eb, gpu, batches, 40, workload="new-inference")
    trainer.stop()
    lines = [
        ln
        for ln in eb.daemon_log.read_text().splitlines()
        if "interleaved probe" in ln and "stopped: over the budget" not in ln
    ]
    assert lines, eb.log_tail()
    read_inside = 0
    for line in lines:
        found = PROBE_LINE.search(line)
        assert found, line
        cores, cpu, gpu_mhz, emc, b, watts, n = found.groups()
        row = next(
            r
            for r in batches[int(b)].rows
            if (r.mode.cores, r.mode.cpu_khz // 1000, r.mode.gpu_hz // 10**6)
            == (int(cores), int(cpu), int(gpu_mhz))
            and r.mode.emc_hz // 10**6 == int(emc)
        )
        if n is None:
            # the sensor thread woke after the batches it was told of (here 2 ms long, on
            # a loaded runner): the window's highest, never below the batches' power
            assert float(watts) >= row.power_w - 0.4, (row, watts)
            continue
        read_inside += 1
        assert int(n) >= 3
        # the emulator's 1 % noise, averaged over the readings; the training steps around
        # the batches draw more than the batches here (stale readings would read high)
        assert float(watts) == pytest.approx(row.power_w, abs=0.4), (row, watts)
    # most probes read their batches from inside them (before: none did)
    assert 2 * read_inside > len(lines), lines
    # what the probes cost is in status, as a window of the job alone would be
    assert _windows_accounted(eb) >= len(lines)


def test_after_an_admin_restore_interleaved_jobs_run_unmanaged_and_quietly(
    board, batches, train_trace, caplog
):
    """Fails on the old client: after `powerctl restore` every step() and batch went to the
    gate with the dead token, was refused, and logged 'gate: unknown_job: ...' (368 lines in
    13 s in a user-testing pass)."""
    import logging

    caplog.set_level(logging.DEBUG, logger="powerd.client")
    eb, gpu = board
    _seed(eb, batches, ("emulated-inference",), train_trace)
    before = knob_snapshot(eb.root)
    trainer = _Trainer(eb, train_trace, gpu, max_s=120)
    assert first_true(lambda: _phase_of(eb, "training") == "tuned", 20), eb.log_tail()
    jobs: dict = {}
    restored: dict = {}

    def on_batch(inf, run) -> None:
        jobs["inf"] = inf
        if "at" not in restored and inf.phase == "tuned" and len(run.batch_sizes) > 20:
            res = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from powerd.cli import ctl_main; sys.exit(ctl_main(sys.argv[1:]))",
                    "--config",
                    str(eb.config_path),
                    "restore",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 0, res.stdout + res.stderr
            restored["at"] = time.monotonic()
            restored["sent"] = inf._gate.sent

    _serve(eb, gpu, batches, 60, on_batch=on_batch)
    trainer.stop()
    assert "at" in restored, eb.log_tail()
    inf = jobs["inf"]
    assert inf.phase == "idle" and "admin's restore" in inf.message
    # at most the batches in flight around the release asked the gate; the rest ran unasked
    assert inf._gate.sent - restored["sent"] <= 3, (inf._gate.sent, restored["sent"])
    refused = [r for r in caplog.records if "unknown_job" in r.getMessage()]
    assert not [r for r in refused if r.levelno >= logging.WARNING], refused[:3]
    assert knob_snapshot(eb.root) == before


def test_an_interleaved_job_that_no_pair_fits_reads_idle_not_tuned(board, batches, train_trace):
    """Every measured pair of the inference workload draws over the budget: the board holds
    the least power measured, and both jobs say no pair stays within the budget (they read
    `tuned` with 'the latency target cannot be met', as if power were not the cause)."""
    eb, gpu = board
    _seed(eb, batches, ("hot-inference",), train_trace, extra_w=30.0)
    trainer = _Trainer(eb, train_trace, gpu)
    assert first_true(lambda: _phase_of(eb, "training") == "tuned", 20), eb.log_tail()
    views: list[dict] = []

    def on_batch(inf, run) -> None:
        if len(run.batch_sizes) % 5 == 0:
            views.append(next(j for j in eb.status()["jobs"] if j["kind"] == "inference"))

    _serve(eb, gpu, batches, 20, workload="hot-inference", on_batch=on_batch)
    trainer.stop()
    assert views, eb.log_tail()
    assert not [v for v in views if v["phase"] == "tuned"], views
    idle = [v for v in views if v["phase"] == "idle"]  # after the probes (profiling)
    assert idle and all(v["feasible"] is False for v in idle), views
    assert "no measured (mode, batch size) pair stays within the budget" in idle[-1]["message"]


def test_a_second_training_job_joining_an_interleaved_pair_takes_turns_at_the_gate(
    board, batches, train_trace
):
    """It read `queued` and stepped ungated beside the gated pair (a user-testing pass): on
    a real GPU its kernels would run into the batches the plan gives the GPU to."""
    eb, gpu = board
    _seed(eb, batches, ("emulated-inference",), train_trace)
    trainer = _Trainer(eb, train_trace, gpu)
    assert first_true(lambda: _phase_of(eb, "training") == "tuned", 20), eb.log_tail()
    seen: dict = {}

    def on_batch(inf, run) -> None:
        if len(run.batch_sizes) == 10 and "second" not in seen:
            job = powerd.request(budget_w=BUDGET, workload="second", endpoint=eb.endpoint)
            seen["second"] = job
            t_end = time.monotonic() + 3.0
            while time.monotonic() < t_end:
                job.step()
                time.sleep(0.01)
            seen["gate"] = job._state.gate
            seen["entered"] = 0 if job._turns is None else job._turns.sent
            seen["phase"] = job.phase
            job.close()

    _serve(eb, gpu, batches, 30, on_batch=on_batch)
    trainer.stop()
    assert "second" in seen, eb.log_tail()
    assert seen["phase"] == "queued"
    assert seen["gate"] == "managed" and seen["entered"] > 0, seen
