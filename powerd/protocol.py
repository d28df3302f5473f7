"""Wire messages between clients and the daemon: JSON, validated by pydantic, versioned.

Every message carries the protocol version `v`, a `type` and a request `id` that the reply
echoes. Nothing is ever pickled. The client library and the daemon both import this module;
it imports nothing of the daemon.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, TypeAdapter, ValidationError

PROTOCOL_VERSION = 1

Phase = Literal["queued", "profiling", "fitting", "tuned", "idle"]
Kind = Literal["training", "inference"]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    v: int = PROTOCOL_VERSION
    id: int = 0


class ModeModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cores: int
    cpu_khz: int
    gpu_hz: int
    emc_hz: int


# ---- requests -----------------------------------------------------------------------------


class Register(_Msg):
    type: Literal["register"] = "register"
    kind: Kind = "training"
    budget_w: FiniteFloat | None = None
    workload: str | None = Field(None, max_length=200)
    latency_ms: FiniteFloat | None = Field(None, gt=0)
    rate_hz: FiniteFloat | None = Field(None, gt=0)
    pid: int | None = None
    # The step-time objective (training): pin the lowest-power mode whose measured step
    # time meets this, within budget_w if one is given. None: the power-budget objective.
    step_time_ms: FiniteFloat | None = Field(None, gt=0)


class Steps(_Msg):
    """Step timestamps (CLOCK_MONOTONIC seconds) since the last batch; empty = heartbeat."""

    type: Literal["steps"] = "steps"
    job: str
    t: list[FiniteFloat] = Field(default_factory=list, max_length=100_000)
    # Inference batches report their own duration (s): the gap between batches is arrival
    # time, not work. Training steps leave this empty and the daemon uses the intervals.
    d: list[FiniteFloat] = Field(default_factory=list, max_length=100_000)


class SetBudget(_Msg):
    type: Literal["set_budget"] = "set_budget"
    job: str
    budget_w: FiniteFloat


class SetRate(_Msg):
    type: Literal["set_rate"] = "set_rate"
    job: str
    rate_hz: FiniteFloat = Field(gt=0)


class Close(_Msg):
    type: Literal["close"] = "close"
    job: str


class Status(_Msg):
    type: Literal["status"] = "status"


class Predict(_Msg):
    type: Literal["predict"] = "predict"
    workload: str


class Pareto(_Msg):
    type: Literal["pareto"] = "pareto"
    workload: str


class SetDefaultBudget(_Msg):
    type: Literal["set_default_budget"] = "set_default_budget"
    budget_w: FiniteFloat


class Restore(_Msg):
    type: Literal["restore"] = "restore"


Request = Annotated[
    Register
    | Steps
    | SetBudget
    | SetRate
    | Close
    | Status
    | Predict
    | Pareto
    | SetDefaultBudget
    | Restore,
    Field(discriminator="type"),
]
REQUEST_TYPES = (
    "register",
    "steps",
    "set_budget",
    "set_rate",
    "close",
    "status",
    "predict",
    "pareto",
    "set_default_budget",
    "restore",
)
ADMIN_TYPES = ("set_default_budget", "restore")
_request_adapter: TypeAdapter[Request] = TypeAdapter(Request)


# ---- replies ------------------------------------------------------------------------------


class JobState(_Msg):
    """A job's view of the daemon: sent after register, every step batch, set_budget."""

    type: Literal["job_state"] = "job_state"
    job: str
    phase: Phase
    mode: ModeModel | None = None
    budget_w: float
    batch_size: int | None = None
    heartbeat_ms: int = 1000
    message: str = ""
    objective: Literal["power_budget", "step_time"] = "power_budget"
    step_time_ms: float | None = None  # the target in force (objective "step_time")
    # step_time: the fastest measured step time when the target cannot be met
    fastest_ms: float | None = None


class Ok(_Msg):
    type: Literal["ok"] = "ok"
    message: str = ""


class StatusReply(_Msg):
    type: Literal["status_reply"] = "status_reply"
    status: dict[str, Any]


class Predictions(_Msg):
    type: Literal["predictions"] = "predictions"
    workload: str
    rows: list[dict[str, Any]]
    extra: dict[str, Any] = Field(default_factory=dict)


ErrorCode = Literal[
    "bad_request",
    "unsupported_version",
    "unknown_job",
    "budget_rejected",
    "forbidden",
    "not_found",
    "internal",
]


class Error(_Msg):
    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


Reply = Annotated[JobState | Ok | StatusReply | Predictions | Error, Field(discriminator="type")]
_reply_adapter: TypeAdapter[Reply] = TypeAdapter(Reply)


class ProtocolError(Exception):
    def __init__(self, code: ErrorCode, message: str, msg_id: int = 0):
        super().__init__(message)
        self.code = code
        self.msg_id = msg_id


def decode_request(raw: bytes) -> Request:
    """Parse and validate one request, raising ProtocolError with a client-facing message."""
    import json

    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("bad_request", f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_request", "a message must be a JSON object")
    msg_id = obj.get("id", 0) if isinstance(obj.get("id", 0), int) else 0
    v = obj.get("v")
    if v != PROTOCOL_VERSION:
        raise ProtocolError(
            "unsupported_version",
            f"protocol version {v!r} not supported; this daemon speaks v{PROTOCOL_VERSION}",
            msg_id,
        )
    if obj.get("type") not in REQUEST_TYPES:
        raise ProtocolError(
            "bad_request",
            f"unknown message type {obj.get('type')!r}; expected one of {', '.join(REQUEST_TYPES)}",
            msg_id,
        )
    try:
        return _request_adapter.validate_python(obj)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'message'}: {e['msg']}"
            for e in exc.errors()
        )
        raise ProtocolError("bad_request", problems, msg_id) from None


def decode_reply(raw: bytes) -> Reply:
    return _reply_adapter.validate_json(raw)


def encode(msg: BaseModel) -> bytes:
    return msg.model_dump_json().encode()
