"""The other tools fleets run next to powerd: jetson-stats (jtop), nvpmodel, jetson_clocks.

Everything here reads files under the device root, so it works on an emulated tree too.
jetson-stats' Python package is never imported: whether it is installed is a spec lookup,
so the daemon runs (and starts fast) without it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from powerd.device.sysfs import DeviceRoot

JTOP_UNIT = "jtop.service"
JTOP_SOCKET = "run/jtop.sock"
UNIT_DIRS = ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system")
# process names of tools known to rewrite the knobs powerd pins
WRITERS = ("nvpmodel", "jetson_clocks", "jtop")


def jtop_state(root: str | Path) -> dict[str, object]:
    """jetson-stats' service as `powerctl status` shows it: "running" (its socket exists),
    "installed" (unit file, no socket), or "absent"; and whether the Python package is
    importable for powerd's own interpreter."""
    dev = DeviceRoot(root)
    unit = next((d for d in UNIT_DIRS if dev.path(f"{d}/{JTOP_UNIT}").exists()), None)
    sock = dev.path(JTOP_SOCKET)
    running = sock.exists()
    return {
        "service": "running" if running else ("installed" if unit else "absent"),
        "unit": f"/{unit}/{JTOP_UNIT}" if unit else None,
        "socket": f"/{JTOP_SOCKET}" if running else None,
        "python_package": _has_module("jtop"),
    }


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def running_writers(root: str | Path) -> list[str]:
    """Processes running now that are known to rewrite pinned knobs ("jtop (pid 812)").
    sysfs does not record who wrote a file, so this is a hint, not proof: a one-shot
    `nvpmodel -m` has usually exited by the time the change is seen. Read only after a
    change was detected (it walks /proc)."""
    proc = DeviceRoot(root).path("proc")
    found: list[str] = []
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return found
    for entry in entries:
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        for name in WRITERS:
            if name in comm or any(Path(a).name == name for a in cmd.split()[:3]):
                found.append(f"{name} (pid {entry.name})")
                break
    return found
