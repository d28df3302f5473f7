"""/etc/powerd.toml -> typed settings. Unknown keys and bad values are errors naming the key."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from powerd.endpoints import DEFAULT_ENDPOINT, endpoint_problem
from powerd.validation import rule_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (JetPack 6)
    import tomli as tomllib

DEFAULT_CONFIG_PATH = "/etc/powerd.toml"


class _Section(BaseModel):
    # strict: a fleet config's typo fails loudly instead of being coerced (true is no 1 W,
    # "5000" no number, 3.0 no count); floats must be finite (no inf/nan limits)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _absolute(key: str, value: str) -> str:
    """A path the daemon and `powerd restore` must agree on, whatever their working dirs."""
    if not value or not os.path.isabs(value):
        raise ValueError(f"{key} must be an absolute path (got {value!r})")
    return value


class ServerConfig(_Section):
    endpoint: str = DEFAULT_ENDPOINT
    socket_group: str = "powerd"
    admin_group: str = "root"
    heartbeat_timeout_ms: int = Field(5000, ge=200, le=600_000)
    # one client cannot starve the others: jobs per connection, jobs in total, and
    # messages per second per connection (bursts of twice that)
    max_jobs_per_client: int = Field(16, ge=1, le=100_000)
    max_jobs: int = Field(256, ge=1, le=100_000)
    max_messages_per_s: float = Field(500.0, gt=0, le=1_000_000)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        # ipc:// with an absolute socket path, or tcp://host:port with the admin socket's
        # port (port + 1) still a port; the daemon also binds the derived sockets
        problem = endpoint_problem(v, bind=True)
        if problem:
            raise ValueError(problem)
        return v


class StrategyConfig(_Section):
    name: Literal["powertrain", "binary-search"] = "powertrain"


class DeviceConfig(_Section):
    root: str = "/"
    core_counts: list[int] = Field(default_factory=list)
    emc_rates_hz: list[int] = Field(default_factory=list)
    # how long read-back may lag a write before a switch counts as failed (cur files and
    # BPMP follow writes after a short delay)
    verify_timeout_ms: int = Field(500, ge=10, le=10_000)
    # another tool (nvpmodel, jetson_clocks, jtop) rewrote a pinned value: write the mode
    # again, or give the board up to it until the next request
    on_external_change: Literal["reapply", "yield"] = "reapply"

    @field_validator("root")
    @classmethod
    def _root_absolute(cls, v: str) -> str:
        return _absolute("root", v)

    @model_validator(mode="after")
    def _positive(self) -> DeviceConfig:
        if any(c < 1 for c in self.core_counts):
            raise ValueError("core_counts must be >= 1")
        if any(r <= 0 for r in self.emc_rates_hz):
            raise ValueError("emc_rates_hz must be > 0")
        return self


class PowerConfig(_Section):
    # At most 250 ms: the control loop's sensor checks have fixed windows (powerd.control
    # FROZEN_S = 2 s). Samples are dithered to 0.5-1.5x the interval, so a longer period
    # leaves gaps near 2 s that read as "no new power samples" (a false fault that gives
    # the board back), and the frozen-sensor check needs 5 samples in its 2.2 s window.
    sample_interval_ms: int = Field(100, ge=5, le=250)


class ProfilingConfig(_Section):
    # at least 4: fewer cannot seed a model and verify a pick (1 pinned the first seed)
    modes: int = Field(50, ge=4, le=1000)
    settle_ms: int = Field(2000, ge=0, le=120_000)
    min_steps: int = Field(5, ge=1, le=10_000)
    window_ms: int = Field(4000, ge=0, le=600_000)
    # A training job may spend up to this share of its steps measuring promising modes
    # after its first commit (each within the budget; a faster one found replaces the pin):
    # of request(expected_steps=N), else of the steps it has run so far (it is taken to run
    # at least as long again). 0: never measure after a commit.
    refine_share: float = Field(0.1, ge=0.0, le=1.0)


class BudgetConfig(_Section):
    default_w: float = Field(30.0, gt=0)
    min_w: float = Field(10.0, gt=0)
    max_w: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> BudgetConfig:
        if not self.min_w <= self.default_w <= self.max_w:
            raise ValueError(
                "need min_w <= default_w <= max_w, "
                f"got {self.min_w} / {self.default_w} / {self.max_w}"
            )
        return self


class StateConfig(_Section):
    dir: str = "/var/lib/powerd"
    # workloads kept in memory (a large mode space costs megabytes each); the least
    # recently used one without a live job is dropped and reloaded from `dir` when needed
    workloads_in_memory: int = Field(8, ge=1, le=10_000)

    @field_validator("dir")
    @classmethod
    def _dir_absolute(cls, v: str) -> str:
        # relative: the daemon's working directory, which `powerd restore` does not share
        return _absolute("dir", v)


class FitConfig(_Section):
    python: str = ""
    # "ridge": closed-form refit of the reference's last layer in the daemon (milliseconds);
    # "torch-finetune": fine-tune in a worker process run by `python` (falls back to ridge)
    method: Literal["ridge", "torch-finetune"] = "ridge"


class InferenceConfig(_Section):
    # an observed arrival rate this far off the job's rate ...
    rate_drift: float = Field(0.2, gt=0, le=10)
    # ... for this long re-solves for the observed rate (no new profiling)
    rate_drift_s: float = Field(10.0, gt=0, le=3600)
    # batch sizes tried when a job does not name its own (the protocol's limits: 1-65536,
    # at most 64 of them)
    batch_sizes: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [1, 4, 16, 32, 64], min_length=1, max_length=64
    )
    # (mode, batch size) pairs profiled at most per inference workload
    max_pairs: int = Field(30, ge=1, le=1000)
    # new pairs a rate change (set_rate or drift) of a job served alone may measure when no
    # measured pair fits the new rate; 0: it never measures (serves the best measured pair,
    # flagged infeasible when none fits). powerd.optimize.inference.RATE_CHANGE_PAIRS.
    rate_change_pairs: int = Field(0, ge=0, le=1000)

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        dup = sorted({b for b in v if v.count(b) > 1})
        if dup:
            raise ValueError(f"batch sizes must be distinct ({', '.join(map(str, dup))} repeated)")
        return v


class Config(_Section):
    server: ServerConfig = ServerConfig()
    strategy: StrategyConfig = StrategyConfig()
    device: DeviceConfig = DeviceConfig()
    power: PowerConfig = PowerConfig()
    profiling: ProfilingConfig = ProfilingConfig()
    budget: BudgetConfig = BudgetConfig()
    state: StateConfig = StateConfig()
    fit: FitConfig = FitConfig()
    inference: InferenceConfig = InferenceConfig()
    # the file this was loaded from (None: built from a dict, or the defaults); not a key
    _path: str | None = PrivateAttr(default=None)

    @property
    def state_dir(self) -> Path:
        return Path(self.state.dir)

    @property
    def path(self) -> str | None:
        """The config file this was loaded from; None for the built-in defaults."""
        return self._path

    @property
    def source(self) -> str:
        """Where these settings come from, for messages: the file, or the defaults."""
        if self._path is not None:
            return self._path
        return f"built-in defaults (no {config_path_from_env()})"

    def __eq__(self, other: object) -> bool:
        # the same settings, wherever they were read from
        if not isinstance(other, Config):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = _Section.__hash__


class ConfigError(Exception):
    """A config file that cannot be used. `errors` holds (key, message) pairs."""

    def __init__(self, path: str, errors: list[tuple[str, str]]):
        self.path = path
        self.errors = errors
        lines = "\n".join(f"  {key}: {msg}" for key, msg in errors)
        super().__init__(f"invalid config {path}:\n{lines}")


def _key_of(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _message(err: Any) -> str:
    """pydantic's error as the rule broken, with the value it got: "must be a valid number
    (got true)", "must be >= 1 (got 0)"."""
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if kind == "too_short":
        n = (err.get("ctx") or {}).get("min_length", 1)
        return "must not be empty" if n == 1 else f"must have at least {n} items"
    msg = rule_of(err)
    value = err.get("input")
    if kind != "too_long" and isinstance(value, (bool, int, float, str)):
        shown = "nan" if isinstance(value, float) and math.isnan(value) else _toml_value(value)
        msg = f"{msg} (got {shown})"
    return msg


def parse_config(data: dict, path: str = "<config>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        errors = [(_key_of(err["loc"]), _message(err)) for err in exc.errors()]
        raise ConfigError(path, errors) from None


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """Load a config file. Only the default /etc/powerd.toml may be missing (then: all
    defaults); a file named with --config or POWERD_CONFIG must exist."""
    if path is None:
        path = config_path_from_env()
        if not os.environ.get("POWERD_CONFIG") and not Path(path).exists():
            return Config()
        named_by = "POWERD_CONFIG"
    else:
        named_by = ""
    p = Path(path)
    if named_by and not p.exists():
        raise ConfigError(str(p), [("(file)", f"No such file or directory (named by {named_by})")])
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), [("(file)", exc.strerror or str(exc))]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), [("(syntax)", str(exc))]) from None
    cfg = parse_config(data, str(p))
    cfg._path = str(p.absolute())
    return cfg


def config_path_from_env() -> str:
    return os.environ.get("POWERD_CONFIG") or DEFAULT_CONFIG_PATH


def dump_toml(cfg: Config) -> str:
    """The effective config as TOML (for `powerd check-config`)."""
    out = []
    for section, model in cfg:
        out.append(f"[{section}]")
        for key, value in model:
            out.append(f"{key} = {_toml_value(value)}")
        out.append("")
    return "\n".join(out)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'
