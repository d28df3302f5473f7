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
    from powerd.optimize.inference import RESOLVE_MAX_PAIRS

    assert InferenceSettings.from_config(Config()).rate_change_pairs == RESOLVE_MAX_PAIRS
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
        ({"server": {"endpoint": "http://x"}}, "server"),
        ({"strategy": {"name": "magic"}}, "strategy.name"),
        ({"budget": {"min_w": 40, "max_w": 30}}, "budget"),
        ({"budget": {"max_w": -1}}, "budget.max_w"),
        ({"device": {"core_counts": [0]}}, "device"),
        ({"profiling": {"modes": 0}}, "profiling.modes"),
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
