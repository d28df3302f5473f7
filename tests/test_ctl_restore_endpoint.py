"""`powerctl restore` / `powerd restore` with no daemon answering (user-testing pass,
finding 6): the saved baseline is looked for in the config's [state] dir. The message names
that dir and the config it came from; when the endpoint tried came from POWERD_ENDPOINT
(or --endpoint) instead of that config, finding nothing there proves nothing (the crashed
daemon may have kept its state elsewhere), so the command fails instead of saying
"nothing to restore" with exit 0 while the board stays pinned."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerd.cli import ctl_main, daemon_main


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("POWERD_ENDPOINT", raising=False)
    monkeypatch.delenv("POWERD_CONFIG", raising=False)
    (tmp_path / "root").mkdir()
    path = tmp_path / "powerd.toml"
    path.write_text(
        f'[server]\nendpoint = "ipc://{tmp_path}/powerd.sock"\n'
        f'[device]\nroot = "{tmp_path}/root"\n[state]\ndir = "{tmp_path}/state"\n'
    )
    return path


def _run(main, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


@pytest.mark.parametrize("how", ["--config", "POWERD_CONFIG"])
def test_an_endpoint_from_powerd_endpoint_and_no_baseline_fails(
    cfg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, how: str
) -> None:
    other = f"ipc://{tmp_path}/demo/powerd.sock"  # a demo daemon's, not this config's
    monkeypatch.setenv("POWERD_ENDPOINT", other)
    args = ["restore"]
    if how == "--config":
        args = ["--config", str(cfg), *args]
    else:
        monkeypatch.setenv("POWERD_CONFIG", str(cfg))
    rc, out, err = _run(ctl_main, args, capsys)
    assert rc == 1
    assert "no daemon answered" in err
    assert (
        f"powerctl: no saved baseline in {tmp_path}/state ([state] dir of {cfg}): "
        "nothing to restore"
    ) in out
    assert f"the endpoint {other} came from POWERD_ENDPOINT, not from {cfg}" in err
    assert "--config FILE" in err


def test_powerd_restore_says_the_same(cfg: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("POWERD_ENDPOINT", f"ipc://{tmp_path}/demo/powerd.sock")
    rc, out, err = _run(daemon_main, ["restore", "--config", str(cfg)], capsys)
    assert rc == 1
    assert f"powerd: no saved baseline in {tmp_path}/state ([state] dir of {cfg})" in out
    assert "came from POWERD_ENDPOINT" in err


@pytest.mark.parametrize("endpoint_env", [False, True])
def test_the_config_s_own_endpoint_and_no_baseline_is_nothing_to_do(
    cfg: Path, tmp_path: Path, monkeypatch, capsys, endpoint_env: bool
) -> None:
    if endpoint_env:  # the same endpoint as the config's: consistent
        monkeypatch.setenv("POWERD_ENDPOINT", f"ipc://{tmp_path}/powerd.sock")
    rc, out, err = _run(ctl_main, ["--config", str(cfg), "restore"], capsys)
    assert rc == 0, err
    assert f"no saved baseline in {tmp_path}/state ([state] dir of {cfg})" in out
    assert "came from" not in err
