"""The emulator tells where its tree lives and warns when that is not in memory."""

import logging
import os
from types import SimpleNamespace

import pytest

from powerd.sim import emulator as emulator_module
from powerd.sim import memfs
from powerd.sim.memfs import IN_MEMORY, fs_type, scratch_dir

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,relatime 0 0
tmpfs /mnt/a\\040b tmpfs rw 0 0
/dev/vdb /mnt/a\\040b/disk xfs rw 0 0
/dev/vdc /srv ext4 rw 0 0
tmpfs /srv tmpfs rw 0 0
"""


def test_the_deepest_mount_point_holding_the_path_decides() -> None:
    assert fs_type("/dev/shm/powerd-sim/sys", MOUNTS) == "tmpfs"
    assert fs_type("/dev/shmx/tree", MOUNTS) == "ext4"  # a prefix is not a parent
    assert fs_type("/tmp/tree", MOUNTS) == "ext4"
    assert fs_type("/mnt/a b/tree", MOUNTS) == "tmpfs"  # escaped space in the mount point
    assert fs_type("/mnt/a b/disk/tree", MOUNTS) == "xfs"
    assert fs_type("/srv/tree", MOUNTS) == "tmpfs"  # the later mount hides the earlier


def test_in_memory_is_unknown_without_a_mount_table() -> None:
    assert fs_type("/dev/shm/tree", MOUNTS) in IN_MEMORY
    assert fs_type("/tmp/tree", MOUNTS) not in IN_MEMORY
    assert fs_type("/tmp/tree", "") is None


@pytest.mark.parametrize(("kind", "warned"), [("ext4", True), ("tmpfs", False)])
def test_the_emulator_warns_at_start_when_its_tree_is_on_a_disk(
    make_emulated_board, monkeypatch, caplog, kind: str, warned: bool
) -> None:
    monkeypatch.setattr(emulator_module, "fs_type", lambda path, mounts=None: kind)
    with caplog.at_level(logging.WARNING, logger="powerd.sim.emulator"):
        emu = make_emulated_board("orin-nano")
    hits = [r.getMessage() for r in caplog.records if "not in memory" in r.getMessage()]
    assert bool(hits) is warned
    if warned:
        assert str(emu.root) in hits[0] and "ext4" in hits[0] and "/dev/shm" in hits[0]


def _statvfs(free_bytes: int):
    return lambda path: SimpleNamespace(f_bavail=free_bytes // 4096, f_frsize=4096)


def test_scratch_is_shared_memory_only_when_writable_with_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memfs.os, "access", lambda path, mode: True)
    monkeypatch.setattr(memfs.os, "statvfs", _statvfs(1 << 30))
    assert scratch_dir() == "/dev/shm"
    monkeypatch.setattr(memfs.os, "statvfs", _statvfs(64 << 20))  # a nearly full /dev/shm
    assert scratch_dir() == "/tmp"
    monkeypatch.setattr(memfs.os, "statvfs", _statvfs(1 << 30))
    monkeypatch.setattr(memfs.os, "access", lambda path, mode: mode != os.W_OK)
    assert scratch_dir() == "/tmp"


def test_scratch_falls_back_without_dev_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(path: str):
        raise FileNotFoundError(path)

    monkeypatch.setattr(memfs.os, "statvfs", missing)
    assert scratch_dir() == "/tmp"
