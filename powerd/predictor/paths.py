"""Where the bundled reference model lives, in a dev checkout, a pip install or the .deb."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_VAR = "POWERD_MODEL_DIR"
# A directory counts as a model dir when it holds these (written by tools/train_reference.py).
REQUIRED_FILES = ("time.onnx", "power.onnx", "scaler.json")


class ModelNotFound(FileNotFoundError):
    """No directory with the reference model files; the message lists every place tried."""


def candidate_dirs(explicit: str | os.PathLike[str] | None = None) -> list[tuple[str, Path]]:
    """(origin, dir) in search order. An explicit argument or the env var, when given, is the
    only candidate: silently falling back to another model would hide a misconfiguration."""
    if explicit is not None and str(explicit) != "":
        return [("argument", Path(explicit))]
    env = os.environ.get(ENV_VAR, "")
    if env:
        return [(f"${ENV_VAR}", Path(env))]
    repo = Path(__file__).resolve().parents[2]
    return [
        ("dev checkout", repo / "models"),
        ("sys.prefix (pip data-files)", Path(sys.prefix) / "share" / "powerd" / "models"),
        ("system (deb)", Path("/usr/share/powerd/models")),
    ]


def find_model_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The first candidate directory holding every file of the reference model."""
    tried = []
    for origin, d in candidate_dirs(explicit):
        missing = [f for f in REQUIRED_FILES if not (d / f).is_file()]
        if not missing:
            return d
        what = "does not exist" if not d.is_dir() else f"lacks {', '.join(missing)}"
        tried.append(f"  {d} ({origin}): {what}")
    raise ModelNotFound(
        "powerd reference model not found; looked in:\n"
        + "\n".join(tried)
        + f"\nSet {ENV_VAR} or pass the directory explicitly; "
        "rebuild with `python tools/train_reference.py` (see models/MODEL_CARD.md)."
    )
