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
