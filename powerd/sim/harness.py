"""An emulated Jetson plus the real daemon in its own process, for the demo, tests and benchmarks.

Everything goes through the real interfaces: the emulator owns a file tree, the daemon is
`powerd serve` with a config whose `[device] root` points at that tree, and jobs talk to it
over its ZeroMQ socket with the public client.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from powerd import protocol as p
from powerd.client import call_once
from powerd.config import dump_toml, parse_config
from powerd.sim.emulator import Emulator, idle_power_w
from powerd.sim.memfs import scratch_dir
from powerd.sim.trace import Trace
from powerd.sim.tree import build_tree


def scaled_profiling(time_scale: float) -> dict[str, int]:
    """The config's profiling windows for a board whose clocks run `time_scale` times real."""
    return {
        "settle_ms": max(60, int(2000 * time_scale)),
        "window_ms": max(150, int(4000 * time_scale)),
        "min_steps": 5,
    }


class EmulatedBoard:
    def __init__(
        self,
        board: str,
        trace: Trace,
        *,
        time_scale: float = 0.05,
        strategy: str = "binary-search",
        workdir: str | Path | None = None,
        config: dict[str, Any] | None = None,
        seed: int = 0,
        daemon_log: str | Path | None = None,
        l4t: str = "35.4.1",
        emulator_options: dict[str, Any] | None = None,
    ):
        self.board = board
        self.trace = trace
        self.time_scale = time_scale
        self._own_dir = workdir is None
        # ipc paths must stay under ~100 characters
        scratch = scratch_dir()
        # absolute: the daemon's socket and state paths must be (a relative workdir was
        # refused as an invalid config)
        self.dir = (
            Path(workdir).resolve()
            if workdir
            else Path(tempfile.mkdtemp(prefix="powerd-", dir=scratch))
        )
        # the emulated sysfs tree is rewritten every few ms: it lives in memory even when
        # the state and logs go to a caller's (disk-backed) workdir
        self._own_root = workdir is not None and scratch != "/tmp"
        self.root = (
            Path(tempfile.mkdtemp(prefix="powerd-root-", dir=scratch)) / "root"
            if self._own_root
            else self.dir / "root"
        )
        self.state_dir = self.dir / "state"
        self.endpoint = f"ipc://{self.dir}/powerd.sock"
        self.config_path = self.dir / "powerd.toml"
        self.daemon_log = Path(daemon_log) if daemon_log else self.dir / "daemon.log"
        self.seed = seed
        self.l4t = l4t
        self.emulator_options = dict(emulator_options or {})  # e.g. injected faults
        cfg: dict[str, Any] = {
            "server": {
                "endpoint": self.endpoint,
                "socket_group": "",
                "admin_group": "",
                "heartbeat_timeout_ms": 1500,
            },
            "strategy": {"name": strategy},
            # an admin would narrow the space to what matters; here: the traced core counts
            "device": {"root": str(self.root), "core_counts": trace.axis("cores")},
            # the default 100 ms period, scaled like the windows (a settle sees ~10-20 samples)
            "power": {"sample_interval_ms": max(5, round(100 * time_scale))},
            "profiling": scaled_profiling(time_scale),
            "budget": {"min_w": 5, "max_w": 80, "default_w": 30},
            "state": {"dir": str(self.state_dir)},
        }
        for section, values in (config or {}).items():
            cfg.setdefault(section, {}).update(values)
        self.emulator: Emulator | None = None
        self.daemon: subprocess.Popen | None = None
        try:
            self.config = parse_config(cfg)
        except Exception:
            self.stop()  # the temporary trees made above are of no use now
            raise

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> EmulatedBoard:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            build_tree(self.root, self.board, self.trace, l4t=self.l4t)
            self.emulator = Emulator(
                self.root,
                self.board,
                self.trace,
                time_scale=self.time_scale,
                seed=self.seed,
                # the INA3221 converts every few ms; unscaled, 50 ms would be 1-2 s of board time
                power_interval_s=max(0.004, 0.05 * self.time_scale),
                idle_w=idle_power_w(self.trace),  # an idle board reads idle, not busy
                **self.emulator_options,
            )
            self.emulator.start()
            self.config_path.write_text(dump_toml(self.config))
            self.start_daemon()
        except BaseException:
            # `with` never reaches __exit__ when __enter__ fails: stop what did start and
            # remove the temporary tree (a trace the board cannot hold left it behind)
            self.stop()
            raise
        return self

    def start_daemon(self, timeout_s: float = 20.0) -> None:
        env = dict(os.environ, POWERD_LOG_TIMES="1")
        env.pop("POWERD_ENDPOINT", None)
        log = open(self.daemon_log, "ab")  # noqa: SIM115 - the child owns it
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "powerd.cli", "serve", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise RuntimeError(
                    f"powerd exited with {self.daemon.returncode}:\n{self.log_tail()}"
                )
            try:
                self.status()
                return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.05)
        raise RuntimeError(f"powerd did not come up in {timeout_s} s:\n{self.log_tail()}")

    def stop_daemon(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int | None:
        if self.daemon is None:
            return None
        if self.daemon.poll() is None:
            self.daemon.send_signal(sig)
            try:
                self.daemon.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        rc = self.daemon.returncode
        self.daemon = None
        return rc

    def stop(self) -> None:
        self.stop_daemon()
        if self.emulator is not None:
            self.emulator.stop()
            self.emulator = None
        if self._own_root:
            shutil.rmtree(self.root.parent, ignore_errors=True)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmulatedBoard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        reply = call_once(self.endpoint, p.Status(), timeout_s=2.0)
        assert isinstance(reply, p.StatusReply)
        return reply.status

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.daemon_log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


KNOB_GLOBS = (
    "sys/devices/system/cpu/cpu*/online",
    "sys/devices/system/cpu/cpufreq/policy*/scaling_min_freq",
    "sys/devices/system/cpu/cpufreq/policy*/scaling_max_freq",
    "sys/devices/**/devfreq/*/min_freq",
    "sys/devices/**/devfreq/*/max_freq",
    "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked",
    "sys/kernel/debug/bpmp/debug/clk/emc/rate",
)


def knob_snapshot(root: Path) -> dict[str, str]:
    """Every knob file the daemon may write, as text: to check that a restore really restored.
    The EMC rate only counts while locked (unlocked, DVFS owns it)."""
    out: dict[str, str] = {}
    for pattern in KNOB_GLOBS:
        for f in sorted(root.glob(pattern)):
            if f.is_file() and not f.is_symlink():
                out[str(f.relative_to(root))] = f.read_text().strip()
    lock = "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked"
    if out.get(lock) == "0":
        out.pop("sys/kernel/debug/bpmp/debug/clk/emc/rate", None)
    return out
