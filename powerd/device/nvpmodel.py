"""The admin's nvpmodel mode: which one is in force, and what it sets.

nvpmodel is the vendor's way of choosing a power mode; the mode in force is the admin's
intent, so it is recorded with the baseline and is the known-good state when the saved
baseline cannot be used. Read-only: powerd never runs `nvpmodel -m`.

`/etc/nvpmodel.conf` has `< PARAM TYPE=FILE NAME=X >` blocks (attribute -> sysfs file)
and `< POWER_MODEL ID=N NAME=... >` blocks (`X ATTR VALUE` lines). The mode in force is in
`/var/lib/nvpmodel/status` (`pmode:0002 fmode:...`), else `nvpmodel -q` prints it.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from powerd.device.sysfs import DeviceRoot

log = logging.getLogger(__name__)

CONF_FILE = "/etc/nvpmodel.conf"
STATUS_FILE = "/var/lib/nvpmodel/status"
NVPMODEL_BIN = "/usr/sbin/nvpmodel"

_HEADER_RE = re.compile(r"^<\s*(\w+)\s*(.*?)\s*>$")
_ATTR_RE = re.compile(r"(\w+)\s*=\s*(\S+)")


@dataclass(frozen=True)
class NvpMode:
    id: int
    name: str
    settings: dict[tuple[str, str], str] = field(default_factory=dict)  # (PARAM, ATTR) -> value


@dataclass(frozen=True)
class NvpConf:
    params: dict[tuple[str, str], str]  # (PARAM, ATTR) -> absolute file path
    modes: dict[int, NvpMode]
    default_id: int | None = None


@dataclass(frozen=True)
class ActiveMode:
    """The nvpmodel mode in force and where that was read."""

    id: int
    name: str
    source: str

    def describe(self) -> str:
        return f"nvpmodel mode {self.id} ({self.name})" if self.name else f"nvpmodel mode {self.id}"

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "source": self.source}


def parse_conf(text: str) -> NvpConf:
    """Parse nvpmodel.conf. Unknown blocks and malformed lines are skipped: the file is the
    vendor's, and only the parts powerd understands matter."""
    params: dict[tuple[str, str], str] = {}
    modes: dict[int, NvpMode] = {}
    default_id: int | None = None
    kind = ""
    param_name = ""
    mode: NvpMode | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head = _HEADER_RE.match(line)
        if head:
            kind = head.group(1).upper()
            attrs = dict(_ATTR_RE.findall(head.group(2)))
            mode = None
            if kind == "PARAM":
                param_name = attrs.get("NAME", "") if attrs.get("TYPE", "FILE") == "FILE" else ""
            elif kind == "POWER_MODEL":
                try:
                    mode = NvpMode(int(attrs["ID"]), attrs.get("NAME", ""), {})
                except (KeyError, ValueError):
                    continue
                modes[mode.id] = mode
            elif kind == "PM_CONFIG":
                try:
                    default_id = int(attrs.get("DEFAULT", ""))
                except ValueError:
                    pass
            continue
        tok = line.split()
        if kind == "PARAM" and param_name and len(tok) == 2:
            params[(param_name, tok[0])] = tok[1]
        elif kind == "POWER_MODEL" and mode is not None and len(tok) == 3:
            mode.settings[(tok[0], tok[1])] = tok[2]
    return NvpConf(params, modes, default_id)


def read_conf(dev: DeviceRoot) -> NvpConf | None:
    path = dev.path(CONF_FILE)
    try:
        return parse_conf(path.read_text(errors="replace"))
    except OSError:
        return None


def _status_mode_id(text: str) -> int | None:
    m = re.search(r"pmode\s*:\s*(\d+)", text)
    return int(m.group(1)) if m else None


def _query_mode_id(dev: DeviceRoot, timeout_s: float = 3.0) -> int | None:
    """`nvpmodel -q` prints "NV Power Mode: NAME" and then the id on a line of its own."""
    binary = dev.path(NVPMODEL_BIN)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return None
    try:
        out = subprocess.run(
            [str(binary), "-q"], capture_output=True, text=True, timeout=timeout_s, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvpmodel -q failed: %s", exc)
        return None
    ids = [int(line.strip()) for line in out.splitlines() if line.strip().isdigit()]
    return ids[-1] if ids else None


def active_mode(dev: DeviceRoot, conf: NvpConf | None = None) -> ActiveMode | None:
    """The nvpmodel mode in force, or None when the board has no nvpmodel."""
    conf = conf if conf is not None else read_conf(dev)
    mode_id: int | None = None
    source = ""
    try:
        mode_id = _status_mode_id(dev.path(STATUS_FILE).read_text(errors="replace"))
        source = STATUS_FILE
    except OSError:
        pass
    if mode_id is None:
        mode_id = _query_mode_id(dev)
        source = "nvpmodel -q"
    if mode_id is None and conf is not None and conf.default_id is not None:
        mode_id, source = conf.default_id, f"{CONF_FILE} (PM_CONFIG DEFAULT)"
    if mode_id is None:
        return None
    name = ""
    if conf is not None and mode_id in conf.modes:
        name = conf.modes[mode_id].name
    return ActiveMode(mode_id, name, source)


def mode_file_values(dev: DeviceRoot, conf: NvpConf, mode_id: int) -> dict[Path, int]:
    """The values mode `mode_id` writes, keyed by the resolved file under the device root
    (so cpuN/cpufreq links and policy directories name the same file)."""
    mode = conf.modes.get(mode_id)
    if mode is None:
        return {}
    out: dict[Path, int] = {}
    for key, value in mode.settings.items():
        target = conf.params.get(key)
        if target is None:
            continue
        try:
            number = int(value)
        except ValueError:
            continue  # "on"/"auto" power-control strings: not a knob powerd writes
        out[dev.path(target).resolve()] = number
    return out
