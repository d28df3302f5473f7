"""Wire messages between clients and the daemon: JSON, validated by pydantic, versioned.

Every message carries the protocol version `v`, a `type` and a request `id` that the reply
echoes. Nothing is ever pickled. The client library and the daemon both import this module;
it imports nothing of the daemon.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    TypeAdapter,
    ValidationError,
    model_validator,
)

PROTOCOL_VERSION = 1

# Bounds checked before a request is parsed: any member of the socket group can send
# anything, and the daemon runs as root. A legitimate request is a flat object with at most
# two lists (steps), so these leave a wide margin.
MAX_FRAME_BYTES = 256 * 1024  # larger frames are refused unread
MAX_CONTAINERS = 32  # `[` and `{` outside strings: bounds nesting depth and object count
MAX_INT_DIGITS = 24  # int("9" * 10**6) is quadratic before Python 3.11's digit limit
MAX_STEPS_PER_MSG = 4096  # the client splits larger backlogs over several messages
MAX_ID_CHARS = 64
MAX_NAME_CHARS = 200
MAX_TIMESTAMP_S = 1e10  # CLOCK_MONOTONIC seconds: ~300 years of uptime
MAX_DURATION_S = 1e6
MAX_BATCH_SIZE = 65536
# The gate's fast-path flag (powerd.gate): a file of FLAG_BYTES holding the id of the training
# job that may step without asking, zero-padded; all zeros: every job asks.
FLAG_ID_BYTES = MAX_ID_CHARS
FLAG_BYTES = 128


def flag_key(job: str) -> bytes:
    """The flag's content while `job` is on the fast path."""
    return job.encode()[:FLAG_ID_BYTES].ljust(FLAG_ID_BYTES, b"\0")


Phase = Literal["queued", "profiling", "fitting", "tuned", "idle"]
Kind = Literal["training", "inference"]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    v: int = PROTOCOL_VERSION
    id: int = 0


JobId = Annotated[str, Field(max_length=MAX_ID_CHARS)]
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(name: str) -> str:
    # a newline in a name would split the daemon's log lines (and forge new ones)
    if _CONTROL.search(name):
        raise ValueError("must not contain control characters (newlines, tabs, ...)")
    return name


WorkloadName = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(_printable)]
Timestamp = Annotated[FiniteFloat, Field(ge=0, le=MAX_TIMESTAMP_S)]
Duration = Annotated[FiniteFloat, Field(ge=0, le=MAX_DURATION_S)]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]


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
    workload: WorkloadName | None = None
    latency_ms: FiniteFloat | None = Field(None, gt=0, le=1e7)
    rate_hz: FiniteFloat | None = Field(None, gt=0, le=1e6)
    pid: int | None = Field(None, ge=0, le=2**31)
    # Inference: the batch sizes the job can run (powerd picks one; None = the daemon's default)
    batch_sizes: list[BatchSize] | None = Field(None, max_length=64)
    # The step-time objective (training): pin the lowest-power mode whose measured step
    # time meets this, within budget_w if one is given. None: the power-budget objective.
    step_time_ms: FiniteFloat | None = Field(None, gt=0)
    # Training: how many steps the job expects to run (None: unknown). A long job affords
    # more measurements after its first commit (`[profiling] refine_share` of its steps).
    expected_steps: int | None = Field(None, ge=1, le=10**12)

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> Register:
        # the other kind's fields mean nothing to this job's planner: refused, not ignored
        for kind, fields in _ONLY_FOR.items():
            given = [f for f in fields if kind != self.kind and getattr(self, f) is not None]
            if given:
                verb = "is" if len(given) == 1 else "are"
                raise ValueError(
                    f"{', '.join(given)} {verb} for {kind} jobs only (this job is "
                    f"kind={self.kind!r})"
                )
        if self.kind == "inference" and self.rate_hz is None:
            raise ValueError(
                "an inference job needs rate_hz (its requests per second): "
                "powerd.request(kind='inference', rate_hz=30, ...)"
            )
        return self


# what each kind of job may say when it registers
_ONLY_FOR = {
    "training": ("step_time_ms", "expected_steps"),
    "inference": ("latency_ms", "rate_hz", "batch_sizes"),
}


class Steps(_Msg):
    """Step timestamps (CLOCK_MONOTONIC seconds) since the last batch; empty = heartbeat."""

    type: Literal["steps"] = "steps"
    job: JobId
    t: list[Timestamp] = Field(default_factory=list, max_length=MAX_STEPS_PER_MSG)
    # Inference batches report their own duration (s): the gap between batches is arrival
    # time, not work. Training steps report the time since the previous step() returned
    # (a wait at the GPU gate excluded); a training job alone is timed by the intervals.
    d: list[Duration] = Field(default_factory=list, max_length=MAX_STEPS_PER_MSG)
    # Inference batches also report their size: one formed before powerd changed the batch
    # size runs at the old one, and only batches of a pair's size measure that pair.
    # Empty: not reported (then every batch counts as the size powerd asked for).
    b: list[BatchSize] = Field(default_factory=list, max_length=MAX_STEPS_PER_MSG)

    @model_validator(mode="after")
    def _one_clock(self) -> Steps:
        # the daemon pairs d[i] with t[i] and times steps by their differences
        if self.d and len(self.d) != len(self.t):
            raise ValueError(f"d has {len(self.d)} durations for {len(self.t)} steps")
        if self.b and len(self.b) != len(self.d):
            raise ValueError(f"b has {len(self.b)} sizes for {len(self.d)} durations")
        if any(b < a for a, b in zip(self.t, self.t[1:], strict=False)):
            raise ValueError("step timestamps must not decrease")
        return self


class SetBudget(_Msg):
    type: Literal["set_budget"] = "set_budget"
    job: JobId
    budget_w: FiniteFloat


class SetRate(_Msg):
    type: Literal["set_rate"] = "set_rate"
    job: JobId
    rate_hz: FiniteFloat = Field(gt=0, le=1e6)


class Gate(_Msg):
    """Managed interleaving: ask for the GPU before a batch ("enter": the daemon answers
    with GateOpen when the slot is free) and give it back after ("leave": no reply). Sent on
    the job's gate socket, authenticated by the token of the job's JobState (that socket
    is not the connection that registered the job).

    The daemon says gate="managed" in the JobState while both kinds share the GPU; only
    then do clients send it."""

    type: Literal["gate"] = "gate"
    job: JobId
    token: str = Field(max_length=64)
    op: Literal["enter", "leave"]
    size: BatchSize | None = None  # the batch size about to run / that ran
    t: FiniteFloat | None = None  # client CLOCK_MONOTONIC seconds of the event


class Close(_Msg):
    type: Literal["close"] = "close"
    job: JobId


class Status(_Msg):
    type: Literal["status"] = "status"


class Predict(_Msg):
    type: Literal["predict"] = "predict"
    workload: WorkloadName


class Pareto(_Msg):
    type: Literal["pareto"] = "pareto"
    workload: WorkloadName
    # inference: the predicted latency/power front per batch size at this arrival rate
    kind: Kind = "training"
    rate_hz: FiniteFloat | None = Field(None, gt=0, le=1e6)
    batch_sizes: list[BatchSize] | None = Field(None, max_length=64)


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
    | Gate
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
    "gate",
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
    # False: no mode meets the budget (training: the job holds the lowest-power mode
    # measured; inference: no (mode, batch size) meets latency_ms under budget_w, and
    # best_latency_ms is the worst-case latency powerd serves with); None: not decided yet
    feasible: bool | None = None
    best_latency_ms: float | None = None
    # "managed": enter each batch through the gate (another job shares the GPU); "open": no gate.
    gate: Literal["open", "managed"] = "open"
    gate_token: str | None = Field(None, max_length=64)
    gate_timeout_ms: int = 5000  # the longest a gate wait may last (heartbeat timeout)
    objective: Literal["power_budget", "step_time"] = "power_budget"
    step_time_ms: float | None = None  # the target in force (objective "step_time")
    # step_time: the fastest measured step time when the target cannot be met
    fastest_ms: float | None = None


class GateOpen(_Msg):
    """The answer to Gate(op="enter"): the GPU slot is this job's until it leaves."""

    type: Literal["gate_open"] = "gate_open"
    job: JobId


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
    "restore_failed",  # an admin restore could not put every value back (message names them)
]


class Error(_Msg):
    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


Reply = Annotated[
    JobState | GateOpen | Ok | StatusReply | Predictions | Error, Field(discriminator="type")
]
_reply_adapter: TypeAdapter[Reply] = TypeAdapter(Reply)


class ProtocolError(Exception):
    def __init__(self, code: ErrorCode, message: str, msg_id: int = 0):
        super().__init__(message)
        self.code = code
        self.msg_id = msg_id


_STRUCTURE = re.compile(rb'["\\[{]')  # what the container scan stops at


def _count_containers(raw: bytes, limit: int) -> int:
    """`[` and `{` outside JSON strings, counting stops past `limit`. Runs at C speed
    through the bytes (regex and bytes.find); only quotes and brackets reach Python."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return 0  # the common case: too few brackets anywhere to matter
    n = 0
    pos = 0
    while n <= limit:
        m = _STRUCTURE.search(raw, pos)
        if m is None:
            break
        if m.group() != b'"':
            n += 1
            pos = m.end()
            continue
        # skip the string: the next quote not escaped by an odd run of backslashes
        end = m.end()
        while True:
            end = raw.find(b'"', end)
            if end < 0:
                return n  # unterminated: json.loads will say so
            slashes = 0
            while raw[end - 1 - slashes] == 0x5C:  # backslash
                slashes += 1
            end += 1
            if slashes % 2 == 0:
                break
        pos = end
    return n


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(text)} digits")
    return int(text)


def _parse_bounded(raw: bytes) -> Any:
    """json.loads behind the size, nesting and number bounds; ProtocolError on any failure."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ProtocolError("bad_request", "a message must be one frame of UTF-8 JSON")
    raw = bytes(raw)
    if len(raw) > MAX_FRAME_BYTES:
        raise ProtocolError(
            "bad_request", f"message of {len(raw)} bytes; the limit is {MAX_FRAME_BYTES}"
        )
    if _count_containers(raw, MAX_CONTAINERS) > MAX_CONTAINERS:
        raise ProtocolError(
            "bad_request", f"more than {MAX_CONTAINERS} nested lists/objects in one message"
        )
    try:
        return json.loads(raw, parse_int=_bounded_int)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ProtocolError("bad_request", f"not JSON: {_short(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the decoder raises, the daemon answers
        raise ProtocolError("bad_request", f"not JSON: {type(exc).__name__}") from None


def _short(what: object, limit: int = 200) -> str:
    text = str(what)
    return text if len(text) <= limit else text[:limit] + "..."


def decode_request(raw: bytes) -> Request:
    """Parse and validate one request, raising ProtocolError with a client-facing message.

    Never raises anything else: the size, nesting and number bounds are checked before
    the JSON is parsed, and any other failure becomes a `bad_request`."""
    obj = _parse_bounded(raw)
    if not isinstance(obj, dict):
        raise ProtocolError("bad_request", "a message must be a JSON object")
    msg_id = obj.get("id", 0)
    if not isinstance(msg_id, int) or isinstance(msg_id, bool):
        msg_id = 0
    v = obj.get("v")
    if v != PROTOCOL_VERSION or isinstance(v, bool):
        raise ProtocolError(
            "unsupported_version",
            f"protocol version {_short(repr(v), 40)} not supported; "
            f"this daemon speaks v{PROTOCOL_VERSION}",
            msg_id,
        )
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in REQUEST_TYPES:
        raise ProtocolError(
            "bad_request",
            f"unknown message type {_short(repr(kind), 40)}; "
            f"expected one of {', '.join(REQUEST_TYPES)}",
            msg_id,
        )
    try:
        return _request_adapter.validate_python(obj)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'message'}: {e['msg']}"
            for e in exc.errors()[:5]
        )
        raise ProtocolError("bad_request", _short(problems, 500), msg_id) from None
    except Exception as exc:  # noqa: BLE001 - a validator bug must not reach the daemon loop
        why = f"invalid {kind}: {type(exc).__name__}"
        raise ProtocolError("bad_request", why, msg_id) from None


def decode_reply(raw: bytes) -> Reply:
    return _reply_adapter.validate_json(raw)


def encode(msg: BaseModel) -> bytes:
    return msg.model_dump_json().encode()
