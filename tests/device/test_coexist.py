"""jetson-stats service state and the hint at who rewrote a pinned value, read under the
device root (a tree laid out like the board's)."""

from pathlib import Path

from powerd.device.coexist import jtop_state, running_writers


def _proc(root: Path, pid: int, comm: str, argv: list[str]) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_jtop_absent_installed_running(tmp_path: Path) -> None:
    assert jtop_state(tmp_path)["service"] == "absent"
    unit = tmp_path / "lib/systemd/system/jtop.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\n")
    st = jtop_state(tmp_path)
    assert st["service"] == "installed" and st["unit"] == "/lib/systemd/system/jtop.service"
    assert st["socket"] is None
    (tmp_path / "run").mkdir()
    (tmp_path / "run/jtop.sock").touch()
    st = jtop_state(tmp_path)
    assert st["service"] == "running" and st["socket"] == "/run/jtop.sock"
    assert isinstance(st["python_package"], bool)


def test_running_writers_names_known_tools_only(tmp_path: Path) -> None:
    assert running_writers(tmp_path) == []  # no /proc under this root: nothing known
    _proc(tmp_path, 812, "python3", ["/usr/bin/python3", "/usr/local/bin/jtop", "--force"])
    _proc(tmp_path, 900, "nvpmodel", ["/usr/sbin/nvpmodel", "-m", "2"])
    _proc(tmp_path, 901, "bash", ["bash", "-c", "echo nvpmodel"])
    (tmp_path / "proc/self").mkdir()
    assert sorted(running_writers(tmp_path)) == ["jtop (pid 812)", "nvpmodel (pid 900)"]
