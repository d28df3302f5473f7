"""The demo: an emulated Orin AGX, the real daemon, and an emulated MobileNet v3 training job
asking for 25 W (on --board orin-nano: that board's own ResNet-18 trace). Prints progress
while powerd profiles, then how good its pick was.

With --serve: only the emulated board and the daemon, until Ctrl-C, so that one's own
training script can ask for a budget (export the POWERD_ENDPOINT it prints)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from powerd.modes import PowerMode
from powerd.sim.harness import EmulatedBoard, knob_snapshot
from powerd.sim.job import run_training_job
from powerd.sim.trace import DEFAULT_TRACES, Trace, load_board_trace


def _mode_str(m: object) -> str:
    if m is None:
        return "-"
    p = PowerMode.from_dict(m) if isinstance(m, dict) else m
    assert isinstance(p, PowerMode)
    return (
        f"{p.cores:>2} cores, CPU {p.cpu_mhz:>4} MHz, GPU {p.gpu_mhz:>4} MHz, "
        f"EMC {p.emc_mhz:>4} MHz"
    )


class Progress(threading.Thread):
    """Polls the daemon's status and shows one line per change (a live line on a terminal)."""

    def __init__(self, board: EmulatedBoard):
        super().__init__(daemon=True)
        self.board = board
        self.stop_event = threading.Event()
        self.tty = sys.stdout.isatty()
        self.t0 = time.monotonic()
        self.last: dict = {}  # the last status that showed a job

    def run(self) -> None:
        last = ""
        while not self.stop_event.wait(0.2):
            try:
                s = self.board.status()
            except Exception:  # noqa: BLE001
                continue
            jobs = s.get("jobs") or []
            if not jobs:
                continue
            self.last = s
            j = jobs[0]
            tuner = s.get("tuner") or {}
            doing = tuner.get("measuring") or tuner.get("committed") or s.get("mode")
            line = (
                f"[{time.monotonic() - self.t0:5.1f}s] {j['phase']:<9} "
                f"{j['profiled_modes']:>2} modes measured | {_mode_str(doing)} | "
                f"{(s.get('power_w') or 0):5.1f} W"
            )
            key = (j["phase"], j["profiled_modes"], str(doing))
            if self.tty:
                print("\r" + line, end="", flush=True)
            elif str(key) != last:
                print(line, flush=True)
            last = str(key)
        if self.tty:
            print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--budget", type=float, default=25.0)
    ap.add_argument("--strategy", default="powertrain", choices=["powertrain", "binary-search"])
    ap.add_argument("--board", default="orin-agx", choices=sorted(DEFAULT_TRACES))
    ap.add_argument("--trace", help="trace CSV (default: a bundled one for the board)")
    ap.add_argument(
        "--batch-size",
        type=int,
        help="inference traces: the batch size to replay as the job's steps (default: smallest)",
    )
    ap.add_argument(
        "--time-scale",
        type=float,
        default=0.05,
        help="emulated step times are the trace's times this much (default 0.05)",
    )
    ap.add_argument("--workload", help="the job's workload name (default: the trace's)")
    ap.add_argument(
        "--serve",
        action="store_true",
        help="run only the emulated board and the daemon until Ctrl-C, for your own script",
    )
    args = ap.parse_args(argv)

    trace = load_board_trace(args.board, args.trace, args.batch_size, "demo: ")
    if trace is None:
        return 2
    if args.serve:
        return serve(args.board, trace, args.time_scale, args.strategy)
    best = trace.best_under(args.budget)
    bs = f"-bs{args.batch_size}" if args.batch_size else ""
    workload = args.workload or trace.name + bs
    board = _start_board(args.board, trace, args.time_scale, args.strategy)
    if board is None:
        return 2
    print(
        f"powerd demo: emulated {args.board} running {trace.name}{bs} "
        f"({len(trace)} traced modes), budget {args.budget:g} W, strategy {args.strategy}"
    )
    try:
        baseline = knob_snapshot(board.root)
        print(f"daemon up at {board.endpoint} (log: {board.daemon_log})")
        progress = Progress(board)
        progress.start()
        run = run_training_job(
            board.root,
            trace,
            args.budget,
            workload,
            args.time_scale,
            endpoint=board.endpoint,
            stay_tuned_s=1.0,
        )
        progress.stop_event.set()
        progress.join()
        # the job closed: the daemon must have put the board back
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and knob_snapshot(board.root) != baseline:
            time.sleep(0.1)
        restored = knob_snapshot(board.root) == baseline
    finally:
        board.stop()

    chosen = run.final_mode
    print()
    print(
        f"steps trained:      {run.steps} ({run.seconds:.1f} s at time scale {args.time_scale:g})"
    )
    last = progress.last
    job = (last.get("jobs") or [{}])[0]
    cost = (last.get("tuner") or {}).get("profiling") or {}
    fit = f", fitted with {job['fit_method']}" if job.get("fit_method") else ""
    print(f"modes profiled:     {job.get('profiled_modes', '?')}{fit}")
    if cost:
        print(
            f"profiling time:     {cost['seconds']:.1f} s, "
            f"{100 * cost['share_above_budget']:.1f} % of it above the budget, "
            f"{100 * cost['share_above_budget_1w']:.1f} % above budget + 1 W"
        )
    if run.tuned_after_s is not None:
        print(
            f"time to decision:   {run.tuned_after_s:.1f} s "
            f"(~{run.tuned_after_s / args.time_scale / 60:.1f} min on a real board)"
        )
    if chosen is None or run.final_phase != "tuned":
        print(f"powerd did not settle on a mode (phase {run.final_phase!r})")
        return 1
    row = trace.lookup(chosen)
    print(f"chosen mode:        {_mode_str(chosen)}")
    print(f"  true (trace):     {row.time_ms:8.1f} ms/step  {row.power_w:6.2f} W")
    if best is not None:
        print(f"best under {args.budget:g} W:    {_mode_str(best.mode)}")
        print(f"  true (trace):     {best.time_ms:8.1f} ms/step  {best.power_w:6.2f} W")
        print(f"time penalty:       {100 * (row.time_ms / best.time_ms - 1):.1f} %")
    over = row.power_w - args.budget
    print(f"budget check:       {'OK' if over <= 0.5 else f'OVER by {over:.2f} W'}")
    print(f"baseline restored:  {'yes' if restored else 'NO'}")
    return 0 if restored and over <= 0.5 else 1


def _start_board(
    board_name: str, trace: Trace, time_scale: float, strategy: str
) -> EmulatedBoard | None:
    """The started board, or None after a one-line error when the trace does not fit it
    (more cores than the board has, say): a usage error, not a traceback."""
    board = EmulatedBoard(board_name, trace, time_scale=time_scale, strategy=strategy)
    try:
        board.start()
    except ValueError as exc:
        print(f"demo: cannot emulate {board_name}: {exc}", file=sys.stderr)
        return None
    return board


def serve(board_name: str, trace: Trace, time_scale: float, strategy: str) -> int:
    """The daemon on an emulated board until SIGINT/SIGTERM; then the board is restored."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    board = _start_board(board_name, trace, time_scale, strategy)
    if board is None:
        return 2
    try:
        baseline = knob_snapshot(board.root)
        print(
            f"powerd is serving an emulated {board_name} ({trace.name}, time scale "
            f"{time_scale:g}, strategy {strategy}).\n"
            f"In another shell, point your training script (or powerctl) at it:\n\n"
            f"    export POWERD_ENDPOINT={board.endpoint}\n\n"
            f"    python -c 'import powerd; job = powerd.request(budget_w=25, "
            f'workload="my-model"); print(job.phase, job.mode)\'\n'
            f"    powerctl status\n\n"
            f"board root: {board.root}\n"
            f"daemon log: {board.daemon_log}\n"
            f"Ctrl-C stops the daemon and restores the board.",
            flush=True,
        )
        while not stop.wait(0.5):
            if board.daemon is None or board.daemon.poll() is not None:
                print(f"the daemon exited:\n{board.log_tail()}", file=sys.stderr)
                return 1
        rc = board.stop_daemon()  # SIGTERM: the daemon releases its jobs and restores
        restored = knob_snapshot(board.root) == baseline
        print(
            f"\ndaemon stopped (exit {rc}); board restored to its baseline: "
            f"{'yes' if restored else 'NO'}",
            flush=True,
        )
    finally:
        board.stop()
    return 0 if rc == 0 and restored else 1


if __name__ == "__main__":
    sys.exit(main())
