"""pydantic validation errors as the rule an argument or config key broke, in one line
("must be > 0 (got 0)"). Shared by the client library, powerctl and the config."""

from __future__ import annotations

import re

from pydantic import ValidationError


def _number(v: object) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    return str(v)


_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def rule_of(err: dict) -> str:
    """One pydantic error as the rule it states, e.g. "must be > 0"."""
    ctx = err.get("ctx") or {}
    if err["type"] in _BOUNDS:
        key, op = _BOUNDS[err["type"]]
        return f"must be {op} {_number(ctx[key])}"
    if err["type"] == "string_too_long":
        return f"must be at most {ctx['max_length']} characters"
    if err["type"] == "too_long":
        return f"must have at most {ctx['max_length']} items"
    if err["type"] == "value_error":  # our own validators say the rule themselves
        return str(err["msg"]).removeprefix("Value error, ")
    # "Input should be a finite number" -> "must be a finite number"
    return re.sub(r"^\w+ should", "must", err["msg"])


def shown(v: object) -> str:
    if isinstance(v, str) and len(v) > 40:
        return f"a string of {len(v)} characters"
    if isinstance(v, (list, tuple)) and len(v) > 8:
        return f"{len(v)} items"
    return _number(v) if isinstance(v, (int, float)) else repr(v)


def describe_invalid(exc: ValidationError) -> str:
    """A ValidationError as one line naming each argument and its rule."""
    parts = []
    for err in exc.errors():
        loc = err["loc"]
        if not loc and err["type"] == "value_error":
            parts.append(rule_of(err))  # a rule across arguments names them itself
            continue
        name = "".join(f"[{x}]" if isinstance(x, int) else str(x) for x in loc) or "value"
        parts.append(f"{name} {rule_of(err)} (got {shown(err['input'])})")
    return "; ".join(parts)
