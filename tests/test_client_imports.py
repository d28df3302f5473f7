"""The client library imports none of the daemon: a training script that does `import
powerd` loads the protocol, the endpoint rules and the client, nothing that drives a board."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAEMON = (
    "powerd.server",
    "powerd.control",
    "powerd.config",
    "powerd.store",
    "powerd.hardware",
    "powerd.device",
    "powerd.optimize",
    "powerd.predictor",
    "powerd.planner",
    "powerd.training",
    "powerd.inference_planner",
    "powerd.interleave_planner",
    "powerd.gate",
)


def test_import_powerd_loads_no_daemon_module() -> None:
    code = (
        "import sys, powerd, powerd.client\n"
        f"bad = [m for m in sys.modules if m.startswith({DAEMON!r})]\n"
        "assert not bad, bad\n"
        "assert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)
