"""The machine a benchmark runs on: is anything else competing for its cores?

The daemon benchmarks measure step and batch times on the emulator in wall time, so other
CPU-bound work shows up as slower modes (a loaded 2-core machine once turned a 0.5 % mean
penalty into 55 %). They print this at the start and the end, so a reader can tell.
"""

from __future__ import annotations

import os

# More runnable work than this share of the cores (1-minute average) counts as loaded.
LOADED_SHARE = 0.75


def load_note(when: str, own: float = 0.0) -> str:
    """One line: the load averages against the core count, with a warning when loaded.
    `own`: the load the benchmark itself adds (its daemon and job: about 1 while it runs)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:  # not every platform reports it
        return f"machine {when}: load average unknown"
    cores = os.cpu_count() or 1
    line = f"machine {when}: load average {one:.2f} (1 min), {five:.2f} (5 min) on {cores} cores"
    if max(one, five) - own > LOADED_SHARE * cores:
        line += (
            " -- LOADED: other work competes with the emulated jobs for the cores; "
            "step times (and so the figures) are not the trace's. Rerun on an idle machine."
        )
    return line
