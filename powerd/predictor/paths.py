"""Where the bundled reference model lives: package data of `powerd` (powerd/models), read
through importlib.resources, so that every install (wheel, editable, .deb, a clean clone on
PYTHONPATH) finds the files next to the code that reads them. No path search: a pip
data-files directory such as /usr/local/share/powerd was never on any search path, which is
how a `sudo pip install .` lost its model. In the repo, powerd/models is a symlink to the
top-level models/ that tools/train_reference.py writes."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

ENV_VAR = "POWERD_MODEL_DIR"
# A directory counts as a model dir when it holds these (written by tools/train_reference.py).
REQUIRED_FILES = ("time.onnx", "power.onnx", "scaler.json")
PACKAGE = "powerd"
RESOURCE_DIR = "models"


class ModelNotFound(FileNotFoundError):
    """The reference model files are missing; the message says where and what to do."""


def bundled_model_dir() -> Path:
    """The model directory shipped inside the installed `powerd` package."""
    d = resources.files(PACKAGE).joinpath(RESOURCE_DIR)
    # The fine-tuning worker (another interpreter) is handed a directory path, so the
    # package must be installed as files: a zipped install is not supported.
    if not isinstance(d, Path):
        raise ModelNotFound(f"powerd is installed as {type(d).__name__}, not as files: {d}")
    return d


def find_model_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The model dir: `explicit`, else $POWERD_MODEL_DIR, else the bundled one. An override
    that lacks a file is an error, never a silent switch to the bundled model."""
    if explicit is not None and str(explicit) != "":
        origin, d = "argument", Path(explicit)
    elif os.environ.get(ENV_VAR, ""):
        origin, d = f"${ENV_VAR}", Path(os.environ[ENV_VAR])
    else:
        origin, d = f"package data of {PACKAGE}", bundled_model_dir()
    missing = [f for f in REQUIRED_FILES if not (d / f).is_file()]
    if not missing:
        return d
    what = "does not exist" if not d.is_dir() else f"lacks {', '.join(missing)}"
    hint = (
        "the installed package is incomplete: reinstall powerd (from a checkout, rebuild the "
        "model with `python tools/train_reference.py`, see models/MODEL_CARD.md)"
        if origin.startswith("package")
        else f"point it at a directory holding {', '.join(REQUIRED_FILES)}"
    )
    raise ModelNotFound(f"powerd reference model not found: {d} ({origin}) {what}; {hint}")
