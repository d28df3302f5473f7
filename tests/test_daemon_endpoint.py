"""The daemon's socket files and signals (user-testing pass, findings 4, 5, 9 and 15): an
endpoint that names a user's file is refused, never deleted; a missing directory is not
made (except the default /run/powerd); SIGHUP is logged and survived; a rejected budget
names the config file the daemon actually read."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_for

import powerd
from powerd.server import _prepare_ipc
from powerd.sim.harness import EmulatedBoard


def _serve(tmp_path: Path, root: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "powerd.toml"
    cfg.write_text(
        f'[server]\nendpoint = "{endpoint}"\nsocket_group = ""\nadmin_group = ""\n'
        f'[strategy]\nname = "binary-search"\n[device]\nroot = "{root}"\n'
        f'[state]\ndir = "{tmp_path}/state"\n'
    )
    return subprocess.run(
        [sys.executable, "-m", "powerd.cli", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_endpoint_naming_a_regular_file_is_refused_and_the_file_kept(tmp_path, emulated_nano):
    """`powerd serve` used to unlink precious.txt and precious-admin.txt (nothing answered
    there, so it took them for stale sockets), then listen in their place."""
    precious = tmp_path / "precious.txt"
    precious.write_text("important data")
    admin = tmp_path / "precious-admin.txt"
    admin.write_text("important2")
    res = _serve(tmp_path, emulated_nano.root, f"ipc://{precious}")
    assert res.returncode == 1, res.stderr
    assert f"{precious} is a file that is not a socket" in res.stderr
    assert "Traceback" not in res.stderr
    assert precious.read_text() == "important data"
    assert admin.read_text() == "important2"


def test_the_admin_path_is_checked_too_and_the_bound_socket_removed(tmp_path, emulated_nano):
    admin = tmp_path / "p-admin.sock"
    admin.write_text("not a socket")
    res = _serve(tmp_path, emulated_nano.root, f"ipc://{tmp_path}/p.sock")
    assert res.returncode == 1
    assert f"{admin} is a file that is not a socket" in res.stderr
    assert admin.read_text() == "not a socket"
    assert not (tmp_path / "p.sock").exists()  # the one it did bind, removed on the way out


def test_a_missing_socket_directory_is_not_created(tmp_path, emulated_nano):
    """A typo'd endpoint made /nonexistent/dir as root."""
    res = _serve(tmp_path, emulated_nano.root, f"ipc://{tmp_path}/nodir/sub/p.sock")
    assert res.returncode == 1
    assert f"the directory {tmp_path}/nodir/sub does not exist" in res.stderr
    assert not (tmp_path / "nodir").exists()


def test_prepare_ipc_removes_only_a_stale_socket(tmp_path):
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # nothing listens: what a crashed daemon leaves
    _prepare_ipc(f"ipc://{stale}")
    assert not stale.exists()

    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ls:
        ls.bind(str(live))
        ls.listen(1)  # another program's socket: it accepts, and answers no powerd status
        with pytest.raises(RuntimeError, match="another program listens on"):
            _prepare_ipc(f"ipc://{live}")
    assert live.exists()

    (tmp_path / "dir.sock").mkdir()
    with pytest.raises(RuntimeError, match="dir.sock is a directory"):
        _prepare_ipc(f"ipc://{tmp_path}/dir.sock")
    assert (tmp_path / "dir.sock").is_dir()

    (tmp_path / "x.sock.gate").write_text("")
    with pytest.raises(RuntimeError, match=r"x\.sock\.gate is a file that is not a socket"):
        _prepare_ipc(f"ipc://{tmp_path}/x.sock")


@pytest.fixture
def board(nano_trace):
    with EmulatedBoard("orin-nano", nano_trace, time_scale=0.05, strategy="binary-search") as b:
        yield b


def test_sighup_is_logged_and_the_daemon_keeps_serving(board):
    """SIGHUP's default action killed the daemon with the board pinned, no restore, no log
    line (and systemd's Restart=on-failure does not restart after it)."""
    job = powerd.request(budget_w=20, workload="hup", endpoint=board.endpoint)
    try:
        board.daemon.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP" in board.daemon_log.read_text(), 10, "the SIGHUP log line")
        assert (
            "SIGHUP: configuration is read at start; restart powerd to apply changes"
            in board.daemon_log.read_text()
        )
        time.sleep(0.3)
        assert board.daemon.poll() is None
        assert [j["id"] for j in board.status()["jobs"]] == [job.id]
    finally:
        job.close()


def test_a_rejected_budget_names_the_config_file_in_use(board):
    """The message said /etc/powerd.toml whatever file the daemon was started with."""
    with pytest.raises(powerd.BudgetRejected) as exc:
        powerd.request(budget_w=500, endpoint=board.endpoint)
    assert f"({board.config_path} [budget])" in str(exc.value)
    assert "/etc/powerd.toml" not in str(exc.value)


def test_a_tcp_endpoint_warns_that_it_has_no_access_control(tmp_path, emulated_nano):
    """socket_group/admin_group guard ipc:// sockets only: on TCP anyone who reaches the
    admin port can restore the board. The daemon says so for both sockets."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = tmp_path / "powerd.toml"
    cfg.write_text(
        f'[server]\nendpoint = "tcp://127.0.0.1:{port}"\n'
        f'[strategy]\nname = "binary-search"\n[device]\nroot = "{emulated_nano.root}"\n'
        f'[state]\ndir = "{tmp_path}/state"\n'
    )
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "powerd.cli", "serve", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "(admin)" in log.read_text(), 20, "the admin socket")
        time.sleep(0.2)
        warned = [ln for ln in log.read_text().splitlines() if "no access control" in ln]
        assert len(warned) == 2, warned
        assert any("any local user can register jobs" in ln for ln in warned), warned
        assert any(f":{port + 1}" in ln and "restore the board" in ln for ln in warned), warned
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_the_saved_default_budget_is_logged_and_one_outside_new_limits_warned(board):
    """`powerctl budget` outlives restarts and wins over the config's default_w: it was
    silent, and silently dropped when new limits left it outside."""
    settings = board.state_dir / "settings.json"
    board.stop_daemon()
    settings.write_text('{"default_budget_w": 17.0}')
    board.start_daemon()
    assert board.status()["default_budget_w"] == 17.0
    assert "default budget 17 W, set by `powerctl budget`" in board.daemon_log.read_text()
    board.stop_daemon()
    settings.write_text('{"default_budget_w": 500.0}')
    board.start_daemon()
    assert board.status()["default_budget_w"] != 500.0
    assert "(500.0 W, in" in board.daemon_log.read_text()
    assert "outside the limits" in board.daemon_log.read_text()
