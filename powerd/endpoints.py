"""powerd's endpoints: where the daemon listens and the sockets derived from it. Shared by
the client library and the daemon's config (pure string rules, no I/O)."""

from __future__ import annotations

import os

DEFAULT_ENDPOINT = "ipc:///run/powerd/powerd.sock"


def resolve_endpoint(endpoint: str | None = None) -> str:
    return endpoint or os.environ.get("POWERD_ENDPOINT") or DEFAULT_ENDPOINT


def ipc_path(endpoint: str) -> str | None:
    """The socket path of an ipc:// endpoint; None for other transports."""
    return endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None


def tcp_address(endpoint: str) -> tuple[str, str] | None:
    """(host, port) of a tcp:// endpoint, as written (an IPv6 host keeps its brackets);
    None for other transports."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    return host, port


def gate_path(endpoint: str) -> str | None:
    """The daemon's gate socket (a UNIX SOCK_SEQPACKET socket next to an ipc endpoint;
    None for other transports): entering the gate is one round trip with no ZeroMQ I/O
    threads in the way (powerd.gate explains)."""
    path = ipc_path(endpoint)
    return None if path is None else path + ".gate"


def gate_flag_path(endpoint: str) -> str | None:
    """The daemon's fast-path flag next to the gate socket (powerd.gate explains)."""
    path = gate_path(endpoint)
    return None if path is None else path + "-flag"


def admin_endpoint(endpoint: str) -> str:
    """Admin commands go to a sibling socket that only the admin group can open."""
    path, address = ipc_path(endpoint), tcp_address(endpoint)
    if path is not None:
        stem, dot, ext = path.rpartition(".")
        return f"ipc://{stem}-admin.{ext}" if dot and "/" not in ext else f"ipc://{path}-admin"
    if address is not None:
        host, port = address
        if port.isascii() and port.isdigit():
            return f"tcp://{host}:{int(port) + 1}"
    raise ValueError(f"unsupported endpoint {endpoint!r}")


UNIX_PATH_MAX = 107  # bytes of a UNIX socket path (sun_path holds 108 with the NUL)
MAX_PORT = 65534  # the admin socket listens on port + 1
# a daemon bound to every interface is reached on the loopback one
WILDCARD_HOSTS = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]"}


def endpoint_problem(endpoint: object, bind: bool = False) -> str | None:
    """What is wrong with an endpoint (None: nothing): ipc:// with an absolute socket path,
    or tcp://HOST:PORT with PORT 1-65534 (the admin socket is on PORT + 1). bind: the
    daemon's own endpoint, whose admin and gate sockets (derived paths) must fit too."""
    if not isinstance(endpoint, str):
        return f"must be a string, e.g. {DEFAULT_ENDPOINT}"
    path, address = ipc_path(endpoint), tcp_address(endpoint)
    if path is not None:
        if not path:
            return f"ipc:// needs a socket path, e.g. {DEFAULT_ENDPOINT}"
        if not path.startswith("/"):
            return f"the ipc socket path must be absolute (got {path!r})"
        if path.endswith("/") or "\0" in path:
            return f"the ipc socket path must name a file, not a directory (got {path!r})"
        paths = [path]
        if bind:
            paths += [str(ipc_path(admin_endpoint(endpoint))), path + ".gate"]
        for one in paths:
            if len(os.fsencode(one)) > UNIX_PATH_MAX:
                return (
                    f"the socket path {one} is longer than {UNIX_PATH_MAX} bytes, the limit of "
                    "a UNIX socket path"
                )
        return None
    if address is not None:
        host, port = address
        if not host:  # no ":" at all leaves the host empty too
            return f"tcp endpoints are tcp://HOST:PORT (got {endpoint!r})"
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= MAX_PORT):
            return (
                f"the tcp port must be a number from 1 to {MAX_PORT} (got {port!r}); the "
                "admin socket listens on port + 1"
            )
        bracketed = host.startswith("[") and host.endswith("]")
        if ":" in host and not bracketed:
            return f"an IPv6 host goes in brackets, e.g. tcp://[::1]:{port} (got {host!r})"
        if any(c.isspace() or c in "/[]" for c in (host[1:-1] if bracketed else host)):
            return f"the tcp host is not a host name or address (got {host!r})"
        return None
    return f"must start with ipc:// or tcp:// (got {endpoint!r})"
