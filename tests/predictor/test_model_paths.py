"""The reference model is package data: explicit > $POWERD_MODEL_DIR > powerd/models, found
through importlib.resources wherever the package is installed, never by a path search."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from powerd.predictor import paths
from powerd.predictor.paths import ENV_VAR, REQUIRED_FILES, ModelNotFound, find_model_dir
from powerd.sim.harness import EmulatedBoard
from powerd.sim.trace import TRACE_DIR, Trace

REPO = Path(__file__).resolve().parents[2]


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


def test_override_without_model_does_not_fall_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A misconfigured path must be an error, not a silent switch to the bundled model.
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(ModelNotFound, match="lacks time.onnx"):
        find_model_dir(tmp_path)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(ModelNotFound, match=r"nowhere \(\$POWERD_MODEL_DIR\) does not exist"):
        find_model_dir()


def test_bundled_model_is_the_repos_models_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a checkout, powerd/models is the symlink to the top-level models/.
    monkeypatch.delenv(ENV_VAR, raising=False)
    d = find_model_dir()
    assert d == Path(paths.__file__).parents[1] / "models"
    assert d.resolve() == (REPO / "models").resolve()


def test_package_without_model_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An installed package that lacks its data says so instead of looking elsewhere.
    fake = tmp_path / "fakepkg"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    make_model_dir(fake / "models")
    (fake / "models" / "power.onnx").unlink()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(paths, "PACKAGE", "fakepkg")
    monkeypatch.delenv(ENV_VAR, raising=False)
    want = r"\(package data of fakepkg\) lacks power.onnx; the installed package is incomplete"
    with pytest.raises(ModelNotFound, match=want):
        find_model_dir()


def _copy_project(dst: Path) -> Path:
    """The files a build reads, symlinks kept (as a clean clone has them)."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    shutil.copytree(REPO / "models", dst / "models", ignore=shutil.ignore_patterns("corpus"))
    shutil.copytree(
        REPO / "powerd", dst / "powerd", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    return dst


def test_installed_wheel_reads_its_own_model(tmp_path: Path) -> None:
    """`pip install .` into a prefix: the model comes with the package, loaded from there."""
    src = _copy_project(tmp_path / "src")
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "--no-deps", "--no-build-isolation", "--target", str(target), str(src)],
        check=True,
        cwd=tmp_path,
    )
    shutil.rmtree(src)  # nothing may point back at the source tree
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", ENV_VAR)}
    # the installed powerd first; its dependencies still come from this interpreter
    env["PYTHONPATH"] = str(target)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import powerd; from powerd.predictor.reference import ReferenceModel as R;"
            "r = R.load(); print(powerd.__file__); print(r.model_dir); print(r.model_id)",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    ).stdout.split()
    assert out[0] == str(target / "powerd" / "__init__.py")
    assert out[1] == str(target / "powerd" / "models")
    assert (target / "powerd" / "models" / "time.pt").is_file()  # the fine-tuning worker's


def test_powertrain_without_model_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No silent switch to the binary search: `powerd serve` exits, naming the missing file."""
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    trace = Trace.load(TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv")
    board = EmulatedBoard("orin-nano", trace, strategy="powertrain", workdir=tmp_path / "b")
    try:
        with pytest.raises(RuntimeError, match=r"powerd exited with 1") as ei:
            board.start()
    finally:
        board.stop()
    msg = str(ei.value)
    assert "strategy powertrain cannot run" in msg
    assert "lacks time.onnx, power.onnx, scaler.json" in msg
