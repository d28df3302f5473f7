"""`powerd serve` as a process: start-up errors, socket permissions, systemd notifications."""

import os
import socket
import stat
import subprocess
import sys

from powerd.sim.harness import EmulatedBoard


def test_serve_on_a_non_jetson_root_exits_with_a_clear_error(tmp_path):
    cfg = tmp_path / "powerd.toml"
    cfg.write_text(
        f'[device]\nroot = "{tmp_path}/empty"\n[state]\ndir = "{tmp_path}/state"\n'
        f'[server]\nendpoint = "ipc://{tmp_path}/s.sock"\n'
    )
    (tmp_path / "empty").mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "powerd.cli", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert "cannot drive the board under root" in res.stderr


def test_serve_refuses_a_bad_config_naming_the_key(tmp_path):
    cfg = tmp_path / "powerd.toml"
    cfg.write_text("[profiling]\nmodes = -3\n")
    res = subprocess.run(
        [sys.executable, "-m", "powerd.cli", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert "profiling.modes" in res.stderr


def test_socket_is_group_accessible_and_admin_socket_too(nano_trace):
    with EmulatedBoard("orin-nano", nano_trace) as b:
        path = b.endpoint[len("ipc://") :]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
        assert stat.S_IMODE(os.stat(path.replace(".sock", "-admin.sock")).st_mode) == 0o660


def test_missing_group_leaves_the_socket_root_only(nano_trace):
    cfg = {"server": {"socket_group": "no-such-group-powerd"}}
    with EmulatedBoard("orin-nano", nano_trace, config=cfg) as b:
        path = b.endpoint[len("ipc://") :]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert "no-such-group-powerd" in b.daemon_log.read_text()


def test_daemon_tells_systemd_it_is_ready(nano_trace, monkeypatch):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    board = EmulatedBoard("orin-nano", nano_trace)
    notify_path = str(board.dir / "notify")
    sock.bind(notify_path)
    sock.settimeout(20)
    monkeypatch.setenv("NOTIFY_SOCKET", notify_path)
    try:
        with board:
            messages = []
            while not any("READY=1" in m for m in messages):
                messages.append(sock.recv(4096).decode())
            board.stop_daemon()
            while not any("STOPPING=1" in m for m in messages):
                messages.append(sock.recv(4096).decode())
    finally:
        sock.close()
