"""python -m powerd.sim --board orin-agx --trace FILE --root DIR: an emulated Jetson.

Builds the file tree, prints its root on stdout (one line, so scripts can read it), then
emulates the board until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from powerd.sim.boards import SIM_BOARDS
from powerd.sim.emulator import Emulator, idle_power_w
from powerd.sim.memfs import scratch_dir
from powerd.sim.trace import Trace, load_board_trace
from powerd.sim.tree import build_tree


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m powerd.sim", description=__doc__.splitlines()[0])
    p.add_argument("--board", choices=sorted(SIM_BOARDS), default="orin-agx")
    p.add_argument("--trace", type=Path, help="trace CSV (default: a bundled one for the board)")
    p.add_argument("--batch-size", type=int, help="inference traces: the batch size to replay")
    p.add_argument(
        "--root",
        type=Path,
        help="tree root (default: a new temporary directory, removed when the emulator stops)",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="scale of emulated delays")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.01, help="power noise (fraction)")
    p.add_argument("--l4t", help="L4T release to report (default: the board's)")
    p.add_argument("--hwmon-index", type=int, help="first hwmonN (default: random from --seed)")
    p.add_argument(
        "--reuse", action="store_true", help="emulate an existing tree under --root as it is"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    trace = load_board_trace(args.board, args.trace, args.batch_size, "")
    if trace is None:
        return 2
    if args.reuse and args.root is None:
        print("--reuse needs --root", file=sys.stderr)
        return 2
    root = args.root or Path(
        tempfile.mkdtemp(prefix=f"powerd-sim-{args.board}-", dir=scratch_dir())
    )
    try:
        return _emulate(args, trace, root)
    finally:
        if args.root is None:  # ours, in memory (scratch_dir), and of no use once stopped
            shutil.rmtree(root, ignore_errors=True)


def _emulate(args: argparse.Namespace, trace: Trace, root: Path) -> int:
    """Build the tree under `root` (unless --reuse) and emulate the board until SIGTERM or
    SIGINT; 2 when the tree cannot be built."""
    if not args.reuse:
        try:
            build_tree(
                root, args.board, trace, l4t=args.l4t, seed=args.seed, hwmon_index=args.hwmon_index
            )
        except ValueError as exc:
            print(f"cannot build the {args.board} tree: {exc}", file=sys.stderr)
            return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with Emulator(
        root,
        args.board,
        trace,
        time_scale=args.time_scale,
        seed=args.seed,
        noise_frac=args.noise,
        idle_w=idle_power_w(trace),
    ):
        print(root.absolute(), flush=True)
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
