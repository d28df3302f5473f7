"""Model dir discovery: explicit > $POWERD_MODEL_DIR > dev checkout > sys.prefix > /usr/share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from powerd.predictor import paths
from powerd.predictor.paths import ENV_VAR, REQUIRED_FILES, ModelNotFound, find_model_dir


def make_model_dir(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for f in REQUIRED_FILES:
        (d / f).write_text("x")
    return d


def test_explicit_argument_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(make_model_dir(tmp_path / "env")))
    assert find_model_dir(make_model_dir(tmp_path / "arg")) == tmp_path / "arg"


def test_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(make_model_dir(tmp_path / "env")))
    assert find_model_dir() == tmp_path / "env"


def test_explicit_dir_without_model_does_not_fall_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A misconfigured path must be an error, not a silent switch to another model.
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(ModelNotFound, match="lacks time.onnx"):
        find_model_dir(tmp_path)


def test_dev_checkout_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    repo_models = Path(paths.__file__).resolve().parents[2] / "models"
    assert find_model_dir() == repo_models


def test_error_lists_every_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    fake_pkg = tmp_path / "site" / "powerd" / "predictor" / "paths.py"
    monkeypatch.setattr(paths, "__file__", str(fake_pkg))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    if Path("/usr/share/powerd/models/time.onnx").exists():
        pytest.skip("a system-wide model is installed")
    with pytest.raises(ModelNotFound) as ei:
        find_model_dir()
    msg = str(ei.value)
    assert str(tmp_path / "site" / "models") in msg
    assert str(tmp_path / "prefix" / "share" / "powerd" / "models") in msg
    assert "/usr/share/powerd/models" in msg
    assert ENV_VAR in msg


def test_sys_prefix_data_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(paths, "__file__", str(tmp_path / "site" / "powerd" / "predictor" / "p.py"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    d = make_model_dir(tmp_path / "prefix" / "share" / "powerd" / "models")
    assert find_model_dir() == d
