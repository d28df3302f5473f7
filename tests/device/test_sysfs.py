import errno
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerd.device.errors import DeviceError, SysfsReadError, SysfsWriteError
from powerd.device.sysfs import (
    DeviceRoot,
    format_cpu_list,
    parse_cpu_list,
    read_int,
    read_int_list,
    read_text,
    write_value,
)


def test_device_root_maps_absolute_paths_under_the_root(tmp_path: Path) -> None:
    dev = DeviceRoot(tmp_path)
    p = dev.path("/sys/devices/system/cpu/online")
    assert p == tmp_path / "sys/devices/system/cpu/online"
    assert dev.rel(p) == "/sys/devices/system/cpu/online"
    assert DeviceRoot("/").path("/sys/x") == Path("/sys/x")


def test_read_text_strips_newline_and_device_tree_nuls(tmp_path: Path) -> None:
    f = tmp_path / "model"
    f.write_bytes(b"NVIDIA Jetson AGX Orin Developer Kit\x00")
    assert read_text(f) == "NVIDIA Jetson AGX Orin Developer Kit"
    f.write_text("2201600\n")
    assert read_int(f) == 2201600
    f.write_text("0 1 2 3 \n")
    assert read_int_list(f) == [0, 1, 2, 3]


def test_read_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SysfsReadError, match="missing_file") as exc:
        read_text(tmp_path / "missing_file")
    assert exc.value.errno == errno.ENOENT
    bad = tmp_path / "scaling_cur_freq"
    bad.write_text("<unknown>\n")
    with pytest.raises(DeviceError, match="scaling_cur_freq.*integer"):
        read_int(bad)


def test_write_replaces_a_longer_value(tmp_path: Path) -> None:
    f = tmp_path / "scaling_max_freq"
    f.write_text("2201600\n")
    write_value(f, 729600)
    assert f.read_text() == "729600\n"


def test_write_failure_raises_sysfs_write_error_with_errno(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "max_freq"
    with pytest.raises(SysfsWriteError) as exc:
        write_value(target, 1300500000)
    err = exc.value
    assert isinstance(err, DeviceError)
    assert err.errno == errno.ENOENT and err.path == target and err.value == "1300500000"
    assert "max_freq" in str(err) and "1300500000" in str(err)


def test_cpu_list_examples() -> None:
    assert parse_cpu_list("0-3,8\n") == [0, 1, 2, 3, 8]
    assert parse_cpu_list("") == []
    assert format_cpu_list([8, 0, 1, 2, 3]) == "0-3,8"
    assert format_cpu_list([0]) == "0"
    with pytest.raises(ValueError, match="bad CPU list"):
        parse_cpu_list("0-x")


@given(st.sets(st.integers(0, 63)))
def test_cpu_list_round_trips(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == sorted(cpus)
