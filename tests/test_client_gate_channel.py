from __future__ import annotations

import socket

from powerd import protocol as p
from powerd.client import _GateChannel
from powerd.endpoints import gate_path


def test_an_enter_whose_daemon_went_away_runs_at_once_and_reconnects_next_time(tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/powerd.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(gate_path(endpoint))
    listener.listen(1)
    channel = _GateChannel(endpoint)
    state = p.JobState(job="j1", phase="tuned", budget_w=20, gate="managed", gate_token="t")
    try:
        channel._socket()  # connected to the daemon's gate socket
        peer, _ = listener.accept()
        peer.close()  # the daemon exits: the next send fails with EPIPE
        waited, refused = channel.enter(state, 1)
        assert refused is None
        assert 0 <= waited < 1.0  # ran at once rather than waiting for an answer
        assert channel._unix is None  # dropped: the next enter connects afresh
    finally:
        channel.close()
        listener.close()
