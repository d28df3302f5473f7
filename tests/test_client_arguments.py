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
        ("set_rate", "abc", "rate_hz must be a number (got 'abc')"),
        ("set_rate", None, "rate_hz must be a valid number (got None)"),
        ("set_budget", math.nan, "budget_w must be a finite number (got nan)"),
        ("set_budget", "abc", "budget_w must be a number (got 'abc')"),
        ("set_budget", "20", "budget_w must be a number (got '20')"),
        ("set_budget", True, "budget_w must be a number (got True)"),
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


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        # True was sent as a 1 W budget (then "budget 1 W is outside the admin's limits");
        # strings and bytes were parsed as numbers
        ({"budget_w": True}, "budget_w must be a number (got True)"),
        ({"budget_w": "20"}, "budget_w must be a number (got '20')"),
        ({"budget_w": b"20"}, "budget_w must be a number (got b'20')"),
        ({"expected_steps": True}, "expected_steps must be a number (got True)"),
        ({"expected_steps": "100"}, "expected_steps must be a number (got '100')"),
        ({"step_time_ms": "5"}, "step_time_ms must be a number (got '5')"),
        ({"latency_ms": False}, "latency_ms must be a number (got False)"),
        ({"rate_hz": "30"}, "rate_hz must be a number (got '30')"),
    ],
)
def test_bools_and_strings_are_not_numbers(fake: FakeDaemon, kw: dict, expected: str) -> None:
    with pytest.raises(powerd.InvalidArgument) as exc:
        _inference(fake, **kw)
    _one_line(exc, expected)
    assert fake.registers == []


def test_numbers_of_other_types_still_work(fake: FakeDaemon) -> None:
    np = pytest.importorskip("numpy")
    with _inference(fake, budget_w=np.float64(20), latency_ms=50, rate_hz=np.float32(30)):
        reg = fake.registers[0]
        assert (reg.budget_w, reg.latency_ms, reg.rate_hz) == (20.0, 50.0, 30.0)


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("garbage", "must start with ipc:// or tcp://"),
        ("tcp://nonsense", "tcp endpoints are tcp://HOST:PORT"),
        ("ipc://", "ipc:// needs a socket path"),
    ],
)
def test_a_malformed_endpoint_is_daemon_unavailable_at_once(
    endpoint: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to raise ZeroMQ's "Invalid argument" on the connection thread (a traceback
    on stderr) and DaemonUnavailable only after the 1.5 s connect timeout."""
    monkeypatch.setenv("POWERD_ENDPOINT", endpoint)
    t0 = time.monotonic()
    with pytest.raises(powerd.DaemonUnavailable) as exc:
        powerd.request(budget_w=20)
    assert time.monotonic() - t0 < 0.5
    assert f"invalid powerd endpoint {endpoint!r}" in str(exc.value) and says in str(exc.value)
    with pytest.warns(RuntimeWarning, match="invalid powerd endpoint"):
        job = powerd.request(budget_w=20, required=False)
    assert isinstance(job, powerd.NoopJob)


def test_a_wildcard_bind_address_is_reached_on_loopback() -> None:
    """A daemon configured with tcp://*:PORT binds every interface; a client given that
    endpoint (powerctl reading the daemon's config) connects to loopback, not to "*"."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with FakeDaemon(f"tcp://*:{port}") as f:
        with powerd.request(budget_w=20, endpoint=f"tcp://*:{port}") as job:
            assert job.phase == "tuned"
        assert len(f.registers) == 1


@pytest.mark.parametrize("required", [True, False])
def test_an_inference_job_without_a_rate_is_an_invalid_argument(tmp_path, required) -> None:
    """It was a RequestFailed from the daemon (not a ValueError), and without a daemon a
    silent NoopJob: the same script behaved differently with and without powerd."""
    with pytest.raises(powerd.InvalidArgument, match="needs rate_hz"):
        powerd.request(
            kind="inference",
            budget_w=15,
            endpoint=f"ipc://{tmp_path}/nobody.sock",
            required=required,
        )
