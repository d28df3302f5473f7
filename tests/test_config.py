import subprocess
import sys
from pathlib import Path

import pytest

from powerd.config import Config, ConfigError, dump_toml, load_config, parse_config

REPO = Path(__file__).resolve().parents[1]


def test_shipped_config_is_valid_and_equals_defaults():
    assert load_config(REPO / "etc" / "powerd.toml") == Config()


def test_inference_keys_reach_the_inference_planner():
    from powerd.inference_planner import InferenceSettings
    from powerd.optimize.inference import RATE_CHANGE_PAIRS

    assert InferenceSettings.from_config(Config()).rate_change_pairs == RATE_CHANGE_PAIRS == 0
    cfg = parse_config(
        {
            "inference": {"rate_change_pairs": 0, "max_pairs": 12},
            "power": {"sample_interval_ms": 50},
        }
    )
    s = InferenceSettings.from_config(cfg)
    assert (s.rate_change_pairs, s.max_pairs, s.sensor_lag_s) == (0, 12, 0.05)
    with pytest.raises(ConfigError, match="rate_change_pairs"):
        parse_config({"inference": {"rate_change_pairs": -1}})


def test_effective_config_round_trips(tmp_path):
    cfg = parse_config({"budget": {"default_w": 20, "min_w": 8}, "device": {"core_counts": [2, 4]}})
    f = tmp_path / "c.toml"
    f.write_text(dump_toml(cfg))
    assert load_config(f) == cfg


@pytest.mark.parametrize(
    "data, key",
    [
        ({"server": {"bogus": 1}}, "server.bogus"),
        ({"nosuchsection": {}}, "nosuchsection"),
        ({"server": {"heartbeat_timeout_ms": "soon"}}, "server.heartbeat_timeout_ms"),
        ({"server": {"endpoint": "http://x"}}, "server.endpoint"),
        ({"strategy": {"name": "magic"}}, "strategy.name"),
        ({"budget": {"min_w": 40, "max_w": 30}}, "budget"),
        ({"budget": {"max_w": -1}}, "budget.max_w"),
        ({"device": {"core_counts": [0]}}, "device"),
        ({"profiling": {"modes": 0}}, "profiling.modes"),
        ({"profiling": {"modes": 1}}, "profiling.modes"),  # pinned the first seed, "tuned"
    ],
)
def test_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    keys = [k for k, _ in exc.value.errors]
    assert key in keys, keys


def test_unknown_key_says_so():
    with pytest.raises(ConfigError) as exc:
        parse_config({"power": {"sample_interval": 5}})
    assert exc.value.errors == [("power.sample_interval", "unknown key")]


def test_syntax_error_is_reported(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[server\n")
    with pytest.raises(ConfigError) as exc:
        load_config(f)
    assert exc.value.errors[0][0] == "(syntax)"


def _check_config(path):
    return subprocess.run(
        [sys.executable, "-m", "powerd.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_config_command(tmp_path):
    good = _check_config(REPO / "etc" / "powerd.toml")
    assert good.returncode == 0, good.stderr
    assert 'name = "powertrain"' in good.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[budget]\ndefault_w = 5\nmin_w = 10\n[fit]\npyhton = ''\n")
    res = _check_config(bad)
    assert res.returncode == 1
    assert "fit.pyhton: unknown key" in res.stderr
    assert "budget:" in res.stderr


# ---- strict values (user-testing pass: findings 7, 8, 9, 12, 13, 15) ---------------------


@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        # loose types pydantic used to coerce: true was a 1 W budget, "5000" a number
        ({"budget": {"default_w": True}}, "budget.default_w", "must be a valid number (got true)"),
        ({"budget": {"min_w": True}}, "budget.min_w", "must be a valid number (got true)"),
        (
            {"server": {"heartbeat_timeout_ms": "5000"}},
            "server.heartbeat_timeout_ms",
            'must be a valid integer (got "5000")',
        ),
        ({"profiling": {"modes": 3.0}}, "profiling.modes", "must be a valid integer (got 3.0)"),
        (
            {"device": {"core_counts": [1.0, 2]}},
            "device.core_counts.0",
            "must be a valid integer (got 1.0)",
        ),
        (
            {"budget": {"max_w": float("inf"), "default_w": 1e9}},
            "budget.max_w",
            "must be a finite number (got inf)",
        ),
        ({"budget": {"max_w": float("nan")}}, "budget.max_w", "must be a finite number (got nan)"),
        # batch sizes: the daemon's tick failed on every pass with these
        ({"inference": {"batch_sizes": []}}, "inference.batch_sizes", "must not be empty"),
        (
            {"inference": {"batch_sizes": [0, -4]}},
            "inference.batch_sizes.0",
            "must be >= 1 (got 0)",
        ),
        (
            {"inference": {"batch_sizes": [4, 16, 4]}},
            "inference.batch_sizes",
            "batch sizes must be distinct (4 repeated)",
        ),
        (  # user-testing pass: the README's "1 to 64 distinct sizes"
            {"inference": {"batch_sizes": [4, 4]}},
            "inference.batch_sizes",
            "batch sizes must be distinct (4 repeated)",
        ),
        (
            {"inference": {"batch_sizes": [100_000]}},
            "inference.batch_sizes.0",
            "must be <= 65536 (got 100000)",
        ),
        # the control loop's stale-sensor window is a fixed 2 s
        (
            {"power": {"sample_interval_ms": 1500}},
            "power.sample_interval_ms",
            "must be <= 250 (got 1500)",
        ),
        # relative state: the daemon's working directory, which `powerd restore` never sees
        ({"state": {"dir": ""}}, "state.dir", "dir must be an absolute path (got '')"),
        (
            {"state": {"dir": "relative/state"}},
            "state.dir",
            "dir must be an absolute path (got 'relative/state')",
        ),
        (
            {"device": {"root": "board"}},
            "device.root",
            "root must be an absolute path (got 'board')",
        ),
    ],
)
def test_loose_or_unusable_values_are_refused(data, key, message):
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert (key, message) in exc.value.errors, exc.value.errors


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("ipc://", "ipc:// needs a socket path"),
        ("ipc://powerd.sock", "must be absolute"),
        ("ipc:///run/powerd/", "must name a file"),
        ("ipc:///" + "d" * 100 + "/p.sock", "longer than 107 bytes"),
        ("tcp://nonsense", "tcp endpoints are tcp://HOST:PORT"),
        ("tcp://127.0.0.1:65535", "from 1 to 65534"),  # the admin socket would be 65536
        ("tcp://127.0.0.1:0", "from 1 to 65534"),
        ("tcp://127.0.0.1:*", "from 1 to 65534"),
        ("tcp://:5599", "tcp endpoints are tcp://HOST:PORT"),
        ("tcp://::1:5599", "brackets"),
        ("http://x", "must start with ipc:// or tcp://"),
    ],
)
def test_an_endpoint_the_daemon_cannot_bind_is_refused(endpoint, says):
    with pytest.raises(ConfigError) as exc:
        parse_config({"server": {"endpoint": endpoint}})
    [(key, msg)] = exc.value.errors
    assert key == "server.endpoint" and says in msg, msg


@pytest.mark.parametrize(
    "endpoint",
    [
        "ipc:///run/powerd/powerd.sock",
        "tcp://*:5599",
        "tcp://127.0.0.1:65534",
        "tcp://[::1]:5599",
        "tcp://jetson-01.lan:5599",
    ],
)
def test_usable_endpoints_pass(endpoint):
    assert parse_config({"server": {"endpoint": endpoint}}).server.endpoint == endpoint


def test_a_missing_config_named_by_powerd_config_is_an_error(tmp_path, monkeypatch):
    missing = tmp_path / "typo.toml"
    monkeypatch.setenv("POWERD_CONFIG", str(missing))
    with pytest.raises(ConfigError) as exc:
        load_config(None)
    assert exc.value.path == str(missing)
    assert exc.value.errors == [("(file)", "No such file or directory (named by POWERD_CONFIG)")]
    with pytest.raises(ConfigError):
        load_config(missing)  # --config FILE: the same


def test_a_missing_default_config_means_defaults(monkeypatch):
    monkeypatch.delenv("POWERD_CONFIG", raising=False)
    monkeypatch.setattr("powerd.config.DEFAULT_CONFIG_PATH", "/nonexistent/powerd.toml")
    cfg = load_config(None)
    assert cfg == Config() and cfg.path is None
    assert cfg.source == "built-in defaults (no /nonexistent/powerd.toml)"


def test_a_loaded_config_knows_its_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[budget]\nmin_w = 5\n")
    cfg = load_config(f)
    assert cfg.path == cfg.source == str(f)
    assert cfg == parse_config({"budget": {"min_w": 5}})  # the same settings compare equal
