"""``ratchet chaos`` deletes exactly the topics it made (``ratchet/chaos/run_topics.py``).

It deleted every topic named ``chaos-<tag>...`` at its end, trusting its tag: one made
before the run (a tag's collision, by hand) went too (session 48's operator leftovers,
left). Real Kafka and Cassandra; the run's tag is known (``uuid4`` drawn by the test),
its migrate a stand-in that succeeds (the keyspace is the run's own, made by
``_make_keyspace``), its start (workers, API) a stand-in that fails, so that the run
cleans up at once.
"""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest
from confluent_kafka.admin import NewTopic

from ratchet.chaos import run_topics

pytestmark = pytest.mark.integration


@pytest.fixture
def chaos_run(settings, kafka_admin, monkeypatch, tmp_path):
    """``run()`` -> the run's tag; a run whose start fails once its topics are made."""
    from ratchet.chaos import runner

    drawn = uuid.uuid4()
    tag = f"1x{drawn.hex[:6]}"
    monkeypatch.setattr(runner.uuid, "uuid4", lambda: drawn)
    monkeypatch.setattr(runner.subprocess, "run",
                        lambda args, **_kw: subprocess.CompletedProcess(args, 0, None, ""))

    def no_start(*_args):
        raise runner.ChaosSetupFailed("stand-in: no workers")

    monkeypatch.setattr(runner, "_start", no_start)

    def run():
        runner.run(settings, runner.ChaosConfig(seed=1, turns=1, faults="none", out=tmp_path))

    yield tag, run
    left = [t for t in kafka_admin.list_topics(timeout=30).topics
            if t.startswith(f"chaos-{tag}")]
    if left:
        for future in kafka_admin.delete_topics(left, operation_timeout=30).values():
            future.result(timeout=60)


def _topics(kafka_admin, prefix: str) -> set[str]:
    return {t for t in kafka_admin.list_topics(timeout=30).topics if t.startswith(prefix)}


def _topics_once_settled(kafka_admin, prefix: str, expected: set[str]) -> set[str]:
    """The topics of ``prefix`` once they are ``expected``, or after 30 s: a deletion is
    answered when the controller has it, and the broker's metadata lists the topic a
    moment longer (a full run of session 49 read all six right after "dropped 6
    topics"). A topic that stays, or one deleted that should not be, still fails."""
    deadline = time.monotonic() + 30
    while (found := _topics(kafka_admin, prefix)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _create(kafka_admin, name: str) -> None:
    (future,) = kafka_admin.create_topics([NewTopic(name, 1, 1)],
                                          operation_timeout=30).values()
    future.result(timeout=60)


def test_a_topic_of_the_runs_prefix_made_before_it_is_left(chaos_run, kafka_admin, capsys,
                                                           settings):
    """Before: deleted with the run's own. Now the run's topics (made, then deleted) go
    and the other stays, named."""
    from ratchet.chaos import runner

    tag, run = chaos_run
    foreign = f"chaos-{tag}.not-the-runs"
    _create(kafka_admin, foreign)
    with pytest.raises(runner.ChaosSetupFailed, match="stand-in: no workers"):
        run()
    assert _topics_once_settled(kafka_admin, f"chaos-{tag}", {foreign}) == {foreign}
    out = capsys.readouterr().out
    assert f"left topic(s) {foreign}: named chaos-{tag}... but not made by this run" in out
    wanted = {t.topic for t in run_topics.wanted(settings, f"chaos-{tag}", 1)}
    assert f"dropped {len(wanted)} topics and keyspace chaos_{tag}" in out, out


def test_a_topic_the_run_would_make_that_exists_is_refused_and_kept(chaos_run, kafka_admin):
    """A topic of the run's names that exists already: the run refuses to start (the
    workers would have used it, the run deleted it), deletes only what it made."""
    tag, run = chaos_run
    theirs = f"chaos-{tag}.gateway-events"
    _create(kafka_admin, theirs)
    from ratchet.chaos.runner import ChaosSetupFailed

    with pytest.raises(ChaosSetupFailed, match=f"topic.s. {theirs} exist already"):
        run()
    assert _topics_once_settled(kafka_admin, f"chaos-{tag}", {theirs}) == {theirs}


def test_the_run_makes_the_topics_its_workers_would(settings):
    """The topics of CONTRACT section 2 under the run's prefix (the worker's own list),
    and Faust's leader topic of the run's group (as Faust names it): one the workers
    made would be neither the run's to delete nor deleted (a leftover of every run)."""
    from dataclasses import replace

    import faust

    from streams.topics import topic_names

    s = replace(settings, topic_prefix="chaos-1xabcdef.")
    leader = faust.App("chaos-1xabcdef")._leader_assignor._leader_topic_name
    assert [t.topic for t in run_topics.wanted(s, "chaos-1xabcdef", 1)] == [
        *vars(topic_names(s)).values(), leader]
