"""Emulated inference and interleaved jobs: arrivals, a FIFO GPU, load-following power, and
latencies measured by the emulated client (through the real client API, against the
stand-in daemon of powerd.sim.fake_daemon: the real daemon does not plan inference yet)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from powerd.optimize.interleave import interleaved_latency_ms, throughput_bound_hz
from powerd.sim.fake_daemon import FakeDaemon, FakeDecision
from powerd.sim.gpu import IDLE_SHARE, Gpu, idle_power, trace_power
from powerd.sim.inference_job import load_batch_traces, run_inference_job
from powerd.sim.job import run_training_job
from powerd.sim.trace import TRACE_DIR, Trace

# The emulated GPU's clock: trace ms x SCALE = wall ms. Latencies are reported in trace ms,
# so the client loop's own wake-up delays are magnified 1/SCALE times: keep it near 1.
SCALE = 0.5
INFER = TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv"


@pytest.fixture(scope="module")
def batches() -> dict[int, Trace]:
    return load_batch_traces(INFER)


@pytest.fixture
def board(emulated_agx, batches):
    return emulated_agx, Gpu(emulated_agx, idle_power(batches[1]), time_scale=SCALE)


@pytest.fixture
def endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/powerd.sock"


def test_board_power_follows_what_the_gpu_runs(board, batches) -> None:
    emu, gpu = board
    mode = emu.effective_mode()
    idle = IDLE_SHARE * batches[1].lookup(mode).power_w
    assert emu.target_power_w() == pytest.approx(idle)
    # A 300 trace-ms batch (150 ms wall): look at the board's power while it runs.
    t = threading.Thread(
        target=gpu.run, args=("inference/16", lambda m: 300.0, trace_power(batches[16]))
    )
    t.start()
    time.sleep(0.03)
    seen = [emu.target_power_w(), emu.power_w()]
    t.join()
    assert seen[0] == pytest.approx(batches[16].lookup(mode).power_w)
    assert seen[1] == pytest.approx(seen[0], rel=0.02)  # a load change is a step, not a ramp
    assert emu.target_power_w() == pytest.approx(idle)  # idle again between work


def test_gpu_runs_one_thing_at_a_time_first_come_first_served(board) -> None:
    _, gpu = board
    threads = [
        threading.Thread(target=gpu.run, args=(f"w{i}", lambda m: 50.0, lambda m: 20.0))
        for i in range(4)
    ]
    for th in threads:
        th.start()
        time.sleep(0.001)
    for th in threads:
        th.join()
    log = sorted(gpu.log, key=lambda s: s.start)
    assert [s.kind for s in log] == ["w0", "w1", "w2", "w3"]
    for a, b in zip(log, log[1:], strict=False):
        assert b.start >= a.end  # never two at once


def test_inference_alone_latency_is_measured_by_the_client(board, batches, endpoint) -> None:
    emu, gpu = board
    mode = emu.effective_mode()
    with FakeDaemon(endpoint, FakeDecision(batch_size=4)):
        run = run_inference_job(gpu, batches, 20.0, duration_s=6, endpoint=endpoint)
    assert set(run.batch_sizes) == {4}
    assert len(run.latencies_ms) >= 0.9 * run.requests - 4
    worst = (4 - 1) / 20.0 * 1000 + batches[4].lookup(mode).time_ms
    # p99 from arrival to the end of the batch: the formula, within jitter and overheads.
    assert 0.9 * worst <= run.p99_ms() <= 1.15 * worst
    assert run.feasible is True


def test_rate_change_reaches_the_daemon_and_the_batches(board, batches, endpoint) -> None:
    _, gpu = board
    fake = FakeDaemon(endpoint, FakeDecision(batch_size=4), on_rate={40.0: FakeDecision(16)})
    with fake:
        run = run_inference_job(
            gpu, batches, 20.0, duration_s=5, endpoint=endpoint, rate_changes=[(2.0, 40.0)]
        )
    assert run.batch_sizes[0] == 4 and run.batch_sizes[-1] == 16


def test_interleaved_training_reaches_the_bound(board, agx_trace, batches, endpoint) -> None:
    emu, gpu = board
    mode = emu.effective_mode()
    b, rate = 16, 10.0
    t_tr, t_inf = agx_trace.lookup(mode).time_ms, batches[b].lookup(mode).time_ms
    out: dict = {}
    with FakeDaemon(endpoint, FakeDecision(batch_size=b)):
        trainer = threading.Thread(
            target=lambda: out.setdefault(
                "run",
                run_training_job(
                    emu.root,
                    agx_trace,
                    20,
                    "mobilenet",
                    SCALE,
                    endpoint=endpoint,
                    stay_tuned_s=3.0,
                    max_s=3.0,
                    gpu=gpu,
                ),
            )
        )
        trainer.start()
        inf = run_inference_job(gpu, batches, rate, duration_s=8, endpoint=endpoint)
        trainer.join()
    # While both jobs run: from the first training step to the end of the earlier job.
    train = [s for s in gpu.log if s.kind == "training"]
    infer = [s for s in gpu.log if s.kind.startswith("inference")]
    start, stop = train[0].start, min(train[-1].end, infer[-1].end)
    steps = [s for s in train if s.end <= stop]
    rate_measured = len(steps) / ((stop - start) / SCALE)
    bound = float(throughput_bound_hz(b, rate, t_inf, t_tr))
    assert rate_measured >= 0.90 * bound  # the client loops' own overheads cost a few %
    worst = float(interleaved_latency_ms(b, rate, t_inf, t_tr))
    assert inf.p99_ms() <= 1.05 * worst
    # and a batch never waited longer than one training step
    waits = [s.start - s.queued for s in gpu.log if s.kind.startswith("inference")]
    assert max(waits) <= 1.2 * t_tr / 1000 * SCALE + 0.005
