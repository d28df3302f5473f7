import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd import protocol as p


def test_round_trip_every_request_type():
    msgs = [
        p.Register(id=1, budget_w=20, workload="w"),
        p.Steps(id=2, job="j", t=[1.0, 2.0]),
        p.SetBudget(id=3, job="j", budget_w=25),
        p.Close(id=4, job="j"),
        p.Status(id=5),
        p.Predict(id=6, workload="w"),
        p.Pareto(id=7, workload="w"),
        p.SetDefaultBudget(id=8, budget_w=30),
        p.Restore(id=9),
    ]
    for m in msgs:
        assert p.decode_request(p.encode(m)) == m


@pytest.mark.parametrize(
    "raw, code, words",
    [
        (b"\xff\xfe", "bad_request", "not JSON"),
        (b"[]", "bad_request", "JSON object"),
        (b'{"v": 99, "type": "status"}', "unsupported_version", "v1"),
        (b'{"type": "status"}', "unsupported_version", "None"),
        (b'{"v": 1, "type": "reboot"}', "bad_request", "unknown message type"),
        (b'{"v": 1, "type": "register", "budget_w": "lots"}', "bad_request", "budget_w"),
        (b'{"v": 1, "type": "register", "budget_w": NaN}', "bad_request", "budget_w"),
        (b'{"v": 1, "type": "steps"}', "bad_request", "job"),
        (b'{"v": 1, "type": "status", "sneaky": 1}', "bad_request", "sneaky"),
        # a newline in a name would split (and forge) the daemon's log lines
        (b'{"v": 1, "type": "register", "workload": "a\\nb"}', "bad_request", "control char"),
        (b'{"v": 1, "type": "register", "workload": "a\\u001b[2J"}', "bad_request", "workload"),
    ],
)
def test_malformed_requests_get_a_clear_error(raw, code, words):
    with pytest.raises(p.ProtocolError) as exc:
        p.decode_request(raw)
    assert exc.value.code == code
    assert words in str(exc.value)


def test_error_echoes_the_request_id():
    with pytest.raises(p.ProtocolError) as exc:
        p.decode_request(b'{"v": 1, "id": 42, "type": "nope"}')
    assert exc.value.msg_id == 42


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_decoder_never_raises_anything_but_protocol_error(obj):
    raw = json.dumps(obj).encode()
    try:
        p.decode_request(raw)
    except p.ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_survives_arbitrary_bytes(raw):
    try:
        p.decode_request(raw)
    except p.ProtocolError:
        pass
