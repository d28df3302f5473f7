"""The benchmarks' load note: a loaded machine is called out, an idle one is not."""

from __future__ import annotations

import pytest

from powerd_replay import machine


def _load(monkeypatch: pytest.MonkeyPatch, one: float, five: float, cores: int) -> None:
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (one, five, five))
    monkeypatch.setattr(machine.os, "cpu_count", lambda: cores)


def test_idle_machine_is_not_called_loaded(monkeypatch):
    _load(monkeypatch, 0.3, 0.5, 2)
    note = machine.load_note("at the start")
    assert "0.30 (1 min), 0.50 (5 min) on 2 cores" in note
    assert "LOADED" not in note


def test_other_work_on_the_cores_is_called_loaded(monkeypatch):
    _load(monkeypatch, 4.2, 3.0, 2)
    assert "LOADED" in machine.load_note("at the start")


def test_the_benchmarks_own_load_is_not_held_against_it(monkeypatch):
    _load(monkeypatch, 1.9, 1.2, 2)  # its daemon and job: about one core
    assert "LOADED" in machine.load_note("at the end")
    assert "LOADED" not in machine.load_note("at the end", own=1.0)


def test_unknown_load_is_said(monkeypatch):
    def fail():
        raise OSError("no load average here")

    monkeypatch.setattr(machine.os, "getloadavg", fail)
    assert "unknown" in machine.load_note("at the start")
