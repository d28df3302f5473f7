"""What the client library says about arguments it cannot send, and about a closed job:
one readable line naming the argument and its rule, at once (against a tiny fake daemon)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import powerd
from powerd.sim.fake_daemon import FakeDaemon, FakeDecision


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDaemon]:
    with FakeDaemon(f"ipc://{tmp_path}/powerd.sock", FakeDecision(batch_size=4)) as f:
        yield f


def _inference(fake: FakeDaemon, **kw: object) -> powerd.InferenceJob:
    args: dict = {"kind": "inference", "rate_hz": 30, "workload": "w", **kw}
    job = powerd.request(endpoint=fake.endpoint, **args)
    assert isinstance(job, powerd.InferenceJob)
    return job


def _one_line(exc: pytest.ExceptionInfo, expected: str) -> None:
    text = str(exc.value)
    assert text == expected, text
    assert isinstance(exc.value, powerd.PowerdError)  # and a ValueError: pytest.raises checked


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"rate_hz": 0}, "rate_hz must be > 0 (got 0)"),
        ({"rate_hz": -2.5}, "rate_hz must be > 0 (got -2.5)"),
        ({"rate_hz": 1e9}, "rate_hz must be <= 1000000 (got 1000000000)"),
        ({"rate_hz": math.nan}, "rate_hz must be a finite number (got nan)"),
        ({"latency_ms": 0}, "latency_ms must be > 0 (got 0)"),
        ({"latency_ms": -1}, "latency_ms must be > 0 (got -1)"),
        ({"latency_ms": math.inf}, "latency_ms must be a finite number (got inf)"),
        ({"budget_w": math.nan}, "budget_w must be a finite number (got nan)"),
        ({"batch_sizes": (0, 4)}, "batch_sizes[0] must be >= 1 (got 0)"),
        ({"batch_sizes": (100000,)}, "batch_sizes[0] must be <= 65536 (got 100000)"),
        ({"kind": "inferense"}, "kind must be 'training' or 'inference' (got 'inferense')"),
        (
            {"workload": "w" * 1000},
            "workload must be at most 200 characters (got a string of 1000 characters)",
        ),
    ],
)
def test_request_with_an_invalid_argument_names_it_and_its_rule(
    fake: FakeDaemon, kw: dict, expected: str
) -> None:
    with pytest.raises(ValueError) as exc:
        _inference(fake, **kw)
    _one_line(exc, expected)
    assert fake.registers == []


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ("16", "batch_sizes must be a sequence of ints (got '16')"),
        (16, "batch_sizes must be a sequence of ints (got 16)"),
        ((1.5, 4), "batch_sizes must be a sequence of ints (1.5 in (1.5, 4) is not one)"),
        ([True, 4], "batch_sizes must be a sequence of ints (True in [True, 4] is not one)"),
        ((), "batch_sizes must not be empty"),
    ],
)
def test_batch_sizes_must_be_a_sequence_of_ints(
    fake: FakeDaemon, sizes: object, expected: str
) -> None:
    with pytest.raises(ValueError) as exc:
        _inference(fake, batch_sizes=sizes)
    _one_line(exc, expected)
    assert fake.registers == []  # "16" used to register as sizes [1, 6]


def test_batch_sizes_keep_whole_floats_and_drop_duplicates(fake: FakeDaemon) -> None:
    with _inference(fake, batch_sizes=[4.0, 16, 4, 1]):
        assert fake.registers[0].batch_sizes == [4, 16, 1]


@pytest.mark.parametrize(
    ("call", "value", "expected"),
    [
        ("set_rate", 0, "rate_hz must be > 0 (got 0)"),
        ("set_rate", -1, "rate_hz must be > 0 (got -1)"),
        ("set_rate", math.nan, "rate_hz must be a finite number (got nan)"),
        (
            "set_rate",
            "abc",
            "rate_hz must be a valid number, unable to parse string as a number (got 'abc')",
        ),
        ("set_rate", None, "rate_hz must be a valid number (got None)"),
        ("set_budget", math.nan, "budget_w must be a finite number (got nan)"),
        (
            "set_budget",
            "abc",
            "budget_w must be a valid number, unable to parse string as a number (got 'abc')",
        ),
    ],
)
def test_set_rate_and_set_budget_with_an_invalid_value_name_the_rule(
    fake: FakeDaemon, call: str, value: object, expected: str
) -> None:
    with _inference(fake) as inf:
        with pytest.raises(ValueError) as exc:
            getattr(inf, call)(value)
        _one_line(exc, expected)


@pytest.mark.parametrize("size", [0, -3, "x", 2.5, True])
def test_a_batch_size_that_is_not_a_positive_int_is_refused(fake: FakeDaemon, size: object) -> None:
    with _inference(fake) as inf:
        with pytest.raises(ValueError, match=r"^size must be a positive int \(got .*\)$"):
            inf.batch(size=size)  # type: ignore[arg-type]
        with inf.batch(size=inf.batch_size + 1):  # another positive size stays allowed
            pass


@pytest.mark.parametrize(
    "call",
    [
        lambda inf: inf.set_rate(10),
        lambda inf: inf.set_budget(15),
        lambda inf: inf.batch(),
    ],
    ids=["set_rate", "set_budget", "batch"],
)
def test_a_closed_job_says_so_at_once(fake: FakeDaemon, call) -> None:  # noqa: ANN001
    inf = _inference(fake)
    inf.close()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"^job {inf.id} is closed$"):
        call(inf)
    assert time.monotonic() - t0 < 1.0


def test_a_job_without_a_daemon_checks_arguments_the_same_way() -> None:
    with pytest.warns(RuntimeWarning, match="not reachable"):
        job = powerd.request(
            kind="inference", rate_hz=30, required=False, endpoint="ipc:///nonexistent/x.sock"
        )
    assert isinstance(job, powerd.NoopJob)
    with pytest.raises(ValueError, match=r"^rate_hz must be > 0 \(got 0\)$"):
        job.set_rate(0)
    with pytest.raises(ValueError, match=r"^budget_w must be a finite number \(got nan\)$"):
        job.set_budget(math.nan)
    with pytest.raises(ValueError, match=r"^size must be a positive int \(got 0\)$"):
        job.batch(size=0)
    job.set_budget(12)
    assert job.budget_w == 12
