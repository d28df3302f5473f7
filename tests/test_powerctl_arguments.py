"""powerctl's numeric arguments: a value the protocol refuses is a one-line usage error
(exit status 2, like any argparse error), never a traceback. No daemon is needed: the
arguments are checked before anything is sent."""

from __future__ import annotations

import pytest

from powerd.cli import ctl_main

PARETO = ["pareto", "--workload", "w", "--kind", "inference"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (PARETO + ["--rate", "0"], "argument --rate: must be > 0 (got 0)"),
        (PARETO + ["--rate", "-3"], "argument --rate: must be > 0 (got -3)"),
        (PARETO + ["--rate", "1e9"], "argument --rate: must be <= 1000000 (got 1e9)"),
        (PARETO + ["--rate", "nan"], "argument --rate: must be a finite number (got nan)"),
        (PARETO + ["--rate", "abc"], "argument --rate: must be a number (got 'abc')"),
        (
            PARETO + ["--rate", "5", "--batch-sizes", "0,4"],
            "argument --batch-sizes: every value must be >= 1 (got 0,4)",
        ),
        (
            PARETO + ["--rate", "5", "--batch-sizes", "abc"],
            "argument --batch-sizes: must be comma-separated integers (got 'abc')",
        ),
        (PARETO + ["--rate", "5", "--latency", "0"], "argument --latency: must be > 0 (got 0)"),
        (
            ["pareto", "--workload", "w", "--budget", "inf"],
            "argument --budget: must be a finite number (got inf)",
        ),
        (["budget", "nan"], "argument watts: must be a finite number (got nan)"),
    ],
)
def test_a_bad_numeric_argument_is_a_one_line_usage_error(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("POWERD_ENDPOINT", "ipc:///nonexistent/powerd.sock")
    with pytest.raises(SystemExit) as exc:
        ctl_main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "Traceback" not in err
    assert err.splitlines()[-1] == f"powerctl {args[0]}: error: {expected}", err


# ---- user-testing pass, finding 19 (and 9, 10, 13) ---------------------------------------


def _usage_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        ctl_main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    return err.splitlines()[-1]


@pytest.fixture
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERD_ENDPOINT", "ipc:///nonexistent/powerd.sock")


@pytest.mark.usefixtures("no_daemon")
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # was a daemon error (bad_request, exit 1) after a round trip
        (PARETO, "--kind inference needs --rate R (the arrival rate in requests/s)"),
        # were silently ignored for a training front
        (["pareto", "--workload", "w", "--rate", "10"], "--rate: only for --kind inference"),
        (
            ["pareto", "--workload", "w", "--batch-sizes", "4", "--latency", "20"],
            "--batch-sizes, --latency: only for --kind inference",
        ),
    ],
)
def test_pareto_options_that_do_not_fit_the_kind_are_usage_errors(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _usage_error(args, capsys) == f"powerctl pareto: error: {expected}"


PLOT_ONLY = "only with --plot FILE (drawn as lines on the plot; the table lists the whole front)"


@pytest.mark.usefixtures("no_daemon")
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["pareto", "--workload", "w", "--budget", "15"], f"--budget: {PLOT_ONLY}"),
        (["pareto", "--workload", "w", "--budget", "15", "--json"], f"--budget: {PLOT_ONLY}"),
        (PARETO + ["--rate", "30", "--latency", "100"], f"--latency: {PLOT_ONLY}"),
        (
            PARETO + ["--rate", "30", "--budget", "15", "--latency", "100", "--json"],
            f"--budget, --latency: {PLOT_ONLY}",
        ),
    ],
    ids=["budget", "budget-json", "latency", "both-json"],
)
def test_pareto_plot_lines_without_plot_are_usage_errors(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """User-testing pass: --budget and --latency without --plot were silently ignored (the
    table is the whole front whatever they say)."""
    assert _usage_error(args, capsys) == f"powerctl pareto: error: {expected}"


@pytest.mark.usefixtures("no_daemon")
@pytest.mark.parametrize(
    ("plot", "expected"),
    [
        ("{tmp}/missing/front.png", "the directory {tmp}/missing does not exist"),
        ("{tmp}/front.txt", "the file name must end in .png, .svg or .pdf (got {tmp}/front.txt)"),
        ("{tmp}/front", "the file name must end in .png, .svg or .pdf (got {tmp}/front)"),
        ("{tmp}/", "{tmp}/ is a directory: name the file, e.g. {tmp}/front.png"),
        ("{tmp}", "{tmp} is a directory: name the file, e.g. {tmp}/front.png"),
    ],
)
def test_a_plot_path_that_cannot_be_written_is_a_usage_error(
    plot: str, expected: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """These were a FileNotFoundError / matplotlib ValueError traceback, or "wrote {tmp}/"
    after writing a hidden {tmp}/.png."""
    args = ["pareto", "--workload", "w", "--plot", plot.format(tmp=tmp_path)]
    last = _usage_error(args, capsys)
    assert last == f"powerctl pareto: error: argument --plot: {expected.format(tmp=tmp_path)}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf", ".PNG"])
def test_plot_formats_matplotlib_writes_are_accepted(suffix: str, tmp_path) -> None:
    from powerd.cli import _plot_problem

    assert _plot_problem(str(tmp_path / f"front{suffix}")) is None


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from powerd import __version__
    from powerd.cli import daemon_main

    for main, prog in ((ctl_main, "powerctl (powerd)"), (daemon_main, "powerd")):
        with pytest.raises(SystemExit) as exc:
            main(["--version"])
        assert exc.value.code == 0
        assert capsys.readouterr().out.strip() == f"{prog} {__version__}"


def test_help_names_units_and_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    def help_of(args: list[str]) -> str:
        with pytest.raises(SystemExit):
            ctl_main([*args, "--help"])
        return " ".join(capsys.readouterr().out.split())

    top = help_of([])
    assert "--endpoint ENDPOINT" in top and "$POWERD_ENDPOINT" in top
    assert "watts" in help_of(["budget"])
    pareto = help_of(["pareto"])
    assert "requests/s" in pareto and "powerd.request(workload=...)" in pareto
    assert "as JSON" in pareto and ".png, .svg or .pdf" in pareto


def test_a_config_error_says_powerctl(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("POWERD_ENDPOINT", raising=False)
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nendpoint = 3\n")
    with pytest.raises(SystemExit) as exc:
        ctl_main(["--config", str(bad), "status"])
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert err.startswith(f"powerctl: invalid config {bad}:"), err


def test_a_missing_powerd_config_file_is_an_error(tmp_path, monkeypatch, capsys) -> None:
    """It was ignored: powerctl (and the daemon) ran on the defaults."""
    monkeypatch.delenv("POWERD_ENDPOINT", raising=False)
    monkeypatch.setenv("POWERD_CONFIG", str(tmp_path / "typo.toml"))
    with pytest.raises(SystemExit) as exc:
        ctl_main(["status"])
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert "typo.toml" in err and "(named by POWERD_CONFIG)" in err


def _ctl(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = ctl_main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.mark.parametrize("endpoint", ["garbage", "tcp://nonsense", "ipc://"])
def test_a_malformed_endpoint_is_one_line(endpoint: str, monkeypatch, capsys) -> None:
    """POWERD_ENDPOINT=garbage was a raw ZMQError traceback."""
    monkeypatch.setenv("POWERD_ENDPOINT", endpoint)
    rc, err = _ctl(["status"], capsys)
    assert rc == 1
    assert err.startswith(f"powerctl: invalid endpoint {endpoint!r} (from POWERD_ENDPOINT): ")
    assert len(err.splitlines()) == 1


def test_a_stale_socket_fails_fast_with_advice_for_the_command_line(
    tmp_path, monkeypatch, capsys
) -> None:
    """A dead daemon's socket file: powerctl waited the full 10 s, then told a shell user
    to "pass required=False" (an argument of the library)."""
    import socket
    import time

    path = tmp_path / "powerd.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nothing listens: what a crash leaves
    monkeypatch.setenv("POWERD_ENDPOINT", f"ipc://{path}")
    t0 = time.monotonic()
    rc, err = _ctl(["status"], capsys)
    assert rc == 1 and time.monotonic() - t0 < 2.0
    assert "required=False" not in err
    assert f"powerd is not reachable at ipc://{path} (from POWERD_ENDPOINT)" in err
    assert "a stale socket" in err
    assert "systemctl status powerd" in err and "--endpoint" in err


def test_a_wildcard_endpoint_from_the_config_is_reached_on_loopback(
    tmp_path, monkeypatch, capsys
) -> None:
    """`tcp://*:PORT` in the daemon's config: powerctl --config connected to "*"."""
    import socket

    from powerd.sim.fake_daemon import FakeDaemon

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("POWERD_ENDPOINT", raising=False)
    cfg = tmp_path / "powerd.toml"
    cfg.write_text(f'[server]\nendpoint = "tcp://*:{port}"\n')
    with FakeDaemon(f"tcp://127.0.0.1:{port}"):
        rc, err = _ctl(["--config", str(cfg), "status"], capsys)
    assert rc == 1  # the fake daemon answers no status: but it was reached
    assert "fake daemon: no status" in err, err


@pytest.mark.parametrize("wait", ["-5", "0", "inf", "soon"])
def test_powerd_restore_wait_must_be_positive_seconds(wait: str, capsys) -> None:
    from powerd.cli import daemon_main

    with pytest.raises(SystemExit) as exc:
        daemon_main(["restore", "--wait", wait])
    assert exc.value.code == 2
    assert "powerd restore: error: argument --wait: must be" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["--endpoint", "ipc:///nonexistent/powerd.sock", "status"],
        ["status", "--endpoint", "ipc:///nonexistent/powerd.sock"],
        ["status", "--json", "--endpoint", "ipc:///nonexistent/powerd.sock"],
        [
            "--endpoint",
            "ipc:///elsewhere.sock",
            "status",
            "--endpoint",
            "ipc:///nonexistent/powerd.sock",
        ],
    ],
)
def test_endpoint_goes_before_or_after_the_command(args, monkeypatch, capsys) -> None:
    """`powerctl status --endpoint X` was refused as an unrecognised argument; after the
    command it wins over the one before it."""
    monkeypatch.delenv("POWERD_ENDPOINT", raising=False)
    rc, err = _ctl(args, capsys)
    assert rc == 1 and "/nonexistent/powerd.sock (from --endpoint)" in err, err
