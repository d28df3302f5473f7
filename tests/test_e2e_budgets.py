"""Budget sweeps through the emulator and the real daemon, replaying the visible traces:
every pinned mode's *true* power (from the trace) is within the budget (+0.5 W noise)."""

import threading
import time

import pytest

import powerd
from powerd.sim.emulator import read_effective_mode
from powerd.sim.harness import EmulatedBoard
from powerd.sim.trace import TRACE_DIR, Trace

TS = 0.03
CASES = [
    ("orin-agx", "orin_agx_mobilenetv3_gld23k_train.csv", [17, 24, 33, 45]),
    ("orin-nano", "orin_nano_resnet18_imagenet_train.csv", [9, 12, 16, 20]),
]
# Step time over the best mode's: the first budget (and every budget on Orin AGX) within
# SANE; a change on Orin Nano after a 9 W first budget within SANE_NANO_CHANGE. This run
# is one noise draw, and replayed over 200 draws that sweep put a change over 1.6x in 9 %
# of them (worst 1.92x); tests/optimize/test_powertrain_changes.py guards that rate
# deterministically.
SANE = 1.6
SANE_NANO_CHANGE = 2.2


def sweep(board, trace, budgets):
    """One job, one budget after another (set_budget); the mode pinned for each."""
    picked = {}
    with powerd.request(budget_w=budgets[0], workload="sweep", endpoint=board.endpoint) as job:
        stop = threading.Event()

        def train():
            while not stop.is_set():
                mode = read_effective_mode(board.root)
                time.sleep(trace.lookup(mode).time_ms / 1000 * TS)
                job.step()

        t = threading.Thread(target=train, daemon=True)
        t.start()
        try:
            for b in budgets:
                if job.budget_w != b:
                    job.set_budget(b)
                deadline = time.monotonic() + 120
                while job.phase != "tuned":
                    assert time.monotonic() < deadline, board.log_tail()
                    time.sleep(0.05)
                picked[b] = job.mode
        finally:
            stop.set()
            t.join()
    return picked


@pytest.mark.parametrize("strategy", ["binary-search", "powertrain"])
@pytest.mark.parametrize("board_name, trace_file, budgets", CASES)
def test_every_pinned_mode_is_within_budget(strategy, board_name, trace_file, budgets):
    trace = Trace.load(TRACE_DIR / trace_file)
    with EmulatedBoard(board_name, trace, time_scale=TS, strategy=strategy) as board:
        picked = sweep(board, trace, budgets)
    for b, mode in picked.items():
        true = trace.lookup(mode)
        assert true.power_w <= b + 0.5, f"{strategy} at {b} W pinned {mode}: {true.power_w} W"
        best = trace.best_under(b)
        # not just safe: within a sane distance of the brute-force best
        sane = SANE if b == budgets[0] or board_name != "orin-nano" else SANE_NANO_CHANGE
        assert true.time_ms <= best.time_ms * sane, (b, mode, true, best)
