"""The store keeps every workload name apart: its directory is one to one with the name, and
every file records the name it was written for. Earlier versions stored "bert/squad" and
"bert squad" (and two names alike in their first 120 characters) in one directory, so a
never-measured workload came back tuned with another workload's samples and decision."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.store import Store, slug, workload_dirname

BOARD = "orin-agx-l4t36.3.0"
MODE_A = PowerMode(12, 2201600, 1300500000, 3199000000)
MODE_B = PowerMode(4, 1113600, 624750000, 2133000000)
LONG = "exp-" + "a" * 120
# pairs of names an earlier version stored in one directory
COLLIDING = [("bert/squad", "bert squad"), (LONG + "-bs16", LONG + "-bs64")]


def _samples(mode: PowerMode, time_ms: float = 50.0) -> dict[PowerMode, Measurement]:
    return {mode: Measurement(mode, time_ms, 18.5, 20)}


def _train(store: Store, name: str, mode: PowerMode) -> None:
    store.save_samples(BOARD, name, _samples(mode))
    store.save_decisions(BOARD, name, {20.0: mode})


def _legacy_dir(store: Store, name: str) -> Path:
    """Where an earlier version stored `name`."""
    return store.dir / "workloads" / slug(BOARD) / slug(name)


def _write_legacy(store: Store, name: str, mode: PowerMode) -> Path:
    """Files as an earlier version wrote them for `name`: samples.json records the name,
    decisions.json and inference.json do not."""
    d = _legacy_dir(store, name)
    d.mkdir(parents=True, exist_ok=True)
    samples = {
        "schema_version": 1,
        "board": BOARD,
        "workload": name,
        "samples": [{**mode.as_dict(), "time_ms": 50.0, "power_w": 18.5, "steps": 20}],
    }
    (d / "samples.json").write_text(json.dumps(samples))
    (d / "decisions.json").write_text(json.dumps({"decisions": {"20.0": mode.as_dict()}}))
    (d / "inference.json").write_text(json.dumps({"format": 1, "pairs": []}))
    return d


@pytest.mark.parametrize(("a", "b"), COLLIDING, ids=["slash-vs-space", "long-prefix"])
def test_names_an_earlier_version_merged_get_their_own_storage(tmp_path, a, b):
    assert slug(a) == slug(b)  # what the bug was
    store = Store(tmp_path)
    assert store.workload_dir(BOARD, a) != store.workload_dir(BOARD, b)
    _train(store, a, MODE_A)
    assert store.load_samples(BOARD, b) == {}
    assert store.load_decisions(BOARD, b) == {}
    _train(store, b, MODE_B)
    assert set(store.load_samples(BOARD, a)) == {MODE_A}
    assert store.load_decisions(BOARD, a) == {20.0: MODE_A}
    assert set(store.load_samples(BOARD, b)) == {MODE_B}
    assert store.load_decisions(BOARD, b) == {20.0: MODE_B}
    assert store.workloads(BOARD) == sorted([a, b])


@pytest.mark.parametrize(("a", "b"), COLLIDING, ids=["slash-vs-space", "long-prefix"])
def test_inference_pairs_of_names_an_earlier_version_merged_stay_apart(tmp_path, a, b):
    store = Store(tmp_path)
    store.save_workload_json(BOARD, a, "inference.json", {"format": 1, "pairs": [{"x": 1}]})
    assert store.load_workload_json(BOARD, b, "inference.json") is None
    doc = store.load_workload_json(BOARD, a, "inference.json")
    assert doc is not None and doc["pairs"] == [{"x": 1}] and doc["workload"] == a
    assert list(store.named_files(BOARD, "inference.json")) == [a]


def test_files_recorded_for_another_name_are_ignored_with_a_warning(tmp_path, caplog):
    """The directory of the safe name bert_squad holds what an earlier version stored there
    for bert/squad: none of it is bert_squad's."""
    store = Store(tmp_path)
    d = _write_legacy(store, "bert/squad", MODE_A)
    assert d == store.workload_dir(BOARD, "bert_squad")
    with caplog.at_level(logging.WARNING, logger="powerd.store"):
        assert store.load_samples(BOARD, "bert_squad") == {}
        assert store.load_decisions(BOARD, "bert_squad") == {}
        assert store.load_workload_json(BOARD, "bert_squad", "inference.json") is None
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3 and all("'bert/squad'" in m for m in warned), warned


def test_a_decisions_file_recording_another_name_is_ignored(tmp_path):
    store = Store(tmp_path)
    _train(store, "r18", MODE_A)
    path = store.workload_dir(BOARD, "r18") / "decisions.json"
    doc = json.loads(path.read_text())
    assert doc["workload"] == "r18"  # recorded from now on
    path.write_text(json.dumps({**doc, "workload": "other"}))
    assert store.load_decisions(BOARD, "r18") == {}


def test_a_samples_file_recording_another_name_is_ignored(tmp_path):
    store = Store(tmp_path)
    store.save_samples(BOARD, "r18", _samples(MODE_A))
    path = store.workload_dir(BOARD, "r18") / "samples.json"
    path.write_text(path.read_text().replace('"r18"', '"other"'))
    assert store.load_samples(BOARD, "r18") == {}


def test_listing_gives_the_names_the_files_record(tmp_path):
    store = Store(tmp_path)
    names = ["bert/squad", "bert squad", "net@bs1", LONG + "-bs16", LONG + "-bs64", "r18"]
    for n in names:
        store.save_samples(BOARD, n, _samples(MODE_A))
    assert store.workloads(BOARD) == sorted(names)
    # each name is found (and read) under the name the listing gives
    assert all(store.load_samples(BOARD, n) for n in store.workloads(BOARD))


def test_listing_reads_the_name_an_earlier_version_recorded(tmp_path):
    store = Store(tmp_path)
    _write_legacy(store, "bert/squad", MODE_A)
    assert store.workloads(BOARD) == ["bert/squad"]
    assert list(store.named_files(BOARD, "inference.json")) == ["bert/squad"]


def test_safe_names_keep_the_directory_of_earlier_versions(tmp_path):
    store = Store(tmp_path)
    for name in ("resnet18-imagenet-bs16", "mobilenet", "r18_infer", "a.b+c", "x" * 120):
        assert store.workload_dir(BOARD, name) == _legacy_dir(store, name)
    # and what an earlier version stored there (decisions, inference pairs without the
    # name) is still read
    _write_legacy(store, "mobilenet", MODE_B)
    assert set(store.load_samples(BOARD, "mobilenet")) == {MODE_B}
    assert store.load_decisions(BOARD, "mobilenet") == {20.0: MODE_B}
    assert store.load_workload_json(BOARD, "mobilenet", "inference.json") is not None
    assert store.workloads(BOARD) == ["mobilenet"]
    # an inference workload alone (no samples.json): its old file is still read and listed
    d = _legacy_dir(store, "r18-infer")
    d.mkdir(parents=True)
    (d / "inference.json").write_text(json.dumps({"format": 1, "pairs": [{"x": 1}]}))
    assert store.load_workload_json(BOARD, "r18-infer", "inference.json") is not None
    assert list(store.named_files(BOARD, "inference.json")) == ["mobilenet", "r18-infer"]


def test_an_unsafe_name_still_finds_what_an_earlier_version_stored_for_it(tmp_path):
    store = Store(tmp_path)
    _write_legacy(store, "bert/squad", MODE_A)
    assert set(store.load_samples(BOARD, "bert/squad")) == {MODE_A}
    assert store.load_decisions(BOARD, "bert/squad") == {20.0: MODE_A}
    # but not the name it collided with, nor the other long name
    assert store.load_samples(BOARD, "bert squad") == {}
    assert store.load_decisions(BOARD, "bert squad") == {}
    assert store.load_workload_json(BOARD, "bert squad", "inference.json") is None
    _write_legacy(store, LONG + "-bs16", MODE_A)
    assert store.load_samples(BOARD, LONG + "-bs64") == {}
    assert store.load_decisions(BOARD, LONG + "-bs64") == {}
    # saving writes to its own directory, which is then read
    _train(store, "bert/squad", MODE_B)
    assert set(store.load_samples(BOARD, "bert/squad")) == {MODE_B}
    assert store.workloads(BOARD) == sorted(["bert/squad", LONG + "-bs16"])


def test_a_safe_name_taking_over_its_directory_leaves_the_earlier_owner_s_files(tmp_path):
    """bert_squad saves into the directory where bert/squad's old files are: the model
    fitted to bert/squad's samples goes, and the files without a name are recorded as
    bert/squad's, so that a restart between two writes never hands them to bert_squad."""
    store = Store(tmp_path)
    d = _write_legacy(store, "bert/squad", MODE_A)
    (d / "model").mkdir()
    (d / "model" / "fitted.json").write_text("{}")
    store.save_samples(BOARD, "bert_squad", _samples(MODE_B))
    assert not (d / "model").exists()
    assert set(store.load_samples(BOARD, "bert_squad")) == {MODE_B}
    assert store.load_decisions(BOARD, "bert_squad") == {}
    assert store.load_workload_json(BOARD, "bert_squad", "inference.json") is None
    assert json.loads((d / "decisions.json").read_text())["workload"] == "bert/squad"


def test_a_safe_name_that_looks_hashed_is_hashed_too(tmp_path):
    """A safe name ending like a hashed directory could be another name's directory."""
    store = Store(tmp_path)
    other = "bert/squad"
    hashed = workload_dirname(other)
    assert hashed != other and slug(hashed) == hashed  # a safe name ...
    assert workload_dirname(hashed) != hashed  # ... that gets a directory of its own
    _train(store, other, MODE_A)
    assert store.load_samples(BOARD, hashed) == {}
    assert store.load_decisions(BOARD, hashed) == {}
    _train(store, hashed, MODE_B)
    assert store.workloads(BOARD) == sorted([other, hashed])
    assert set(store.load_samples(BOARD, other)) == {MODE_A}


def test_directory_names_stay_short_and_safe():
    for name in ("", ".", "..", "/", "a" * 200, "é" * 200, "x/../../y", "\ud800", "unnamed"):
        d = workload_dirname(name)
        assert 0 < len(d) <= 120 and slug(d) == d and d not in (".", ".."), name


_names = st.one_of(
    st.text(max_size=200),
    st.text(alphabet="ab/ _.-0123456789cdef", max_size=140),
    st.builds(lambda s: LONG + s, st.text(alphabet="ab/ -", max_size=20)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_names, min_size=2, max_size=6, unique=True))
def test_the_directory_is_one_to_one(names):
    # with the directory names themselves used as names, too
    every = set(names) | {workload_dirname(n) for n in names}
    assert len({workload_dirname(n) for n in every}) == len(every)
