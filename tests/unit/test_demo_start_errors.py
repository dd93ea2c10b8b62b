"""``ratchet demo`` whose servers or keyspace are in an odd state says so in a line and
exits 2, the code of its other start failures: a launcher refusal (another home's
server on the port, a damaged ``state.json``) or a keyspace migrate refuses (a newer
version's) ended in a traceback (an operator's review, session 46). The servers and
the keyspace are stand-ins that fail as the real ones do."""

from __future__ import annotations

import dataclasses

import pytest

import services.demo as demo
from infra import launcher
from infra.migrate import SchemaAhead
from ratchet.settings import Settings


@pytest.fixture
def settings(tmp_path):
    return dataclasses.replace(Settings.from_env({}), home=tmp_path)


def _fail(exc: Exception):
    def raise_it(*_args, **_kwargs):
        raise exc
    return raise_it


@pytest.mark.parametrize("where,exc", [
    ("up", launcher.InfraError("cassandra failed to start: the cassandra of RATCHET_HOME=/h "
                               "(pid 1) serves port 9042, the settings name 19042")),
    ("prepare", SchemaAhead("keyspace ratchet records migration(s) 999_future, which this "
                            "ratchet does not have")),
])
def test_a_refused_start_is_a_line_and_exit_2(settings, monkeypatch, capsys, where, exc):
    monkeypatch.setattr(launcher, "up", _fail(exc) if where == "up" else lambda *a, **k: None)
    monkeypatch.setattr(demo, "prepare", _fail(exc) if where == "prepare" else lambda s: None)
    started = []
    monkeypatch.setattr(demo, "start_worker", lambda *a: started.append("worker"))
    assert demo.cli_demo(settings) == 2
    out = capsys.readouterr().out
    assert f"FAILED to start: {exc}" in out, out
    assert started == []  # nothing was started after the refusal
