"""Exceptions raised by the client library (and the protocol's error codes)."""


class PowerdError(Exception):
    """Base class of every powerd client error."""


class DaemonUnavailable(PowerdError):
    """No powerd daemon answered at the endpoint."""


class BudgetRejected(PowerdError):
    """The budget is outside the admin's limits."""

    def __init__(self, message: str, min_w: float | None = None, max_w: float | None = None):
        super().__init__(message)
        self.min_w = min_w
        self.max_w = max_w


class RequestFailed(PowerdError):
    """The daemon answered a request with an error."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class InvalidArgument(PowerdError, ValueError):
    """An argument breaks the protocol's rules (a ValueError: `except ValueError` works)."""


class JobClosed(PowerdError, RuntimeError):
    """The job was closed: it no longer talks to the daemon."""


class JobReleased(RequestFailed):
    """An admin's restore (`powerctl restore`) ended the job on purpose: powerd no longer
    drives the board for it, and does not take it again by itself. Register a new job to
    have powerd drive the board again."""

    def __init__(self, message: str):
        super().__init__("unknown_job", message)
