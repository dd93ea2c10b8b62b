"""One chaos run, start to verdict.

1. A fresh keyspace and topic prefix (the run's tag), migrations, schemas.
2. Workers (one consumer group) and the API as ``ratchet`` subprocesses.
3. The output reader, the ``wait_ms`` waiters, the producer processes and the faults.
4. When every story is sent and every fault done: wait until every turn is decided
   (or the drain deadline passes: what is left is reported ``never_decided``). Sending
   has a deadline of its own (``send_budget_s``: from turns, rate and the fault plan):
   producers still at work after it (a round failing again and again, e.g. an API that
   refuses every claim) are stopped and the run fails ``run_deadline``.
5. Histories over HTTP, the checker, the report; stop the workers and the API; make
   sure the servers are healthy again.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from ratchet.chaos import crosstenant, damage, run_topics, timed
from ratchet.chaos import report as reporting
from ratchet.chaos.checker import check, sends_per_response
from ratchet.chaos.faults import PROFILES, Cluster, FaultInjector
from ratchet.chaos.observations import Violation
from ratchet.chaos.observe import OutputReader, Waiters, fetch_histories, observer_violations
from ratchet.chaos.oracle import Expectation, expect
from ratchet.chaos.produce import run as produce_run
from ratchet.chaos.story import REUSE_TTL_MS, workload_fp_hash
from ratchet.chaos.workload import generate
from ratchet.settings import Settings
from schemas.avro import register_schemas, registry_client


class ChaosSetupFailed(RuntimeError):
    """The run could not start (a server unreachable, the workers or the API never
    ready): ``str()`` is the operator's one line. Nothing was checked, so it is neither
    a pass nor a violation (``ratchet chaos`` exits 3); what the run had made is removed
    and no server is started or healed (no fault was injected)."""


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    turns: int = 2000
    rate: float = 20.0  # turns per second, all producers together
    producers: int = 2
    workers: int = 2
    faults: str = "ci"
    fault_gap_s: float = 8.0
    faults_start_s: float = 10.0
    drain_timeout_s: float = 300.0
    out: Path | None = None
    # The workers' and API's RATCHET_LOG_LEVEL (INFO shows, e.g., partitions parked).
    log_level: str = "WARNING"
    # Seconds from the start until every turn must be sent and every fault done; None:
    # ``send_budget_s``.
    send_deadline_s: float | None = None


def send_budget_s(cfg: ChaosConfig, faults: int) -> float:
    """How long sending (and the faults of the plan) may take before the run fails
    ``run_deadline``: three times the paced sending time (``turns / rate``), two minutes,
    and per fault of the plan its gap and 90 s (a restart waits for its server)."""
    if cfg.send_deadline_s is not None:
        return cfg.send_deadline_s
    return (cfg.faults_start_s + 120 + 3 * cfg.turns / cfg.rate
            + faults * (cfg.fault_gap_s + 90))


def stop_producers(procs, stop, grace_s: float = 10.0) -> list[str]:
    """Ask the producers to stop (they look between rounds), then terminate those still
    alive after ``grace_s`` (stuck sending one round again and again). Returns what was
    done to each, for the report."""
    stop.value = 1
    deadline = time.monotonic() + grace_s
    done = []
    for n, p in enumerate(procs):
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
            done.append(f"producer {n} (pid {p.pid}) terminated")
        else:
            done.append(f"producer {n} stopped")
    return done


def _say(msg: str, t0: float = time.monotonic()) -> None:
    print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)


def run(base: Settings, cfg: ChaosConfig) -> dict[str, Any]:
    tag = f"{cfg.seed}x{uuid.uuid4().hex[:6]}"
    settings = replace(base, topic_prefix=f"chaos-{tag}.", keyspace=f"chaos_{tag}",
                       worker_metrics_port=0)
    out = (cfg.out or Path("chaos-out")) / tag
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings.to_env(), "RATCHET_CONSUMER_GROUP": f"chaos-{tag}",
           "RATCHET_LOG_LEVEL": cfg.log_level}
    t0, t0_wall = time.monotonic(), time.time()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)

    workload = generate(cfg.seed, cfg.turns, tag)
    expectations = [expect(s) for s in workload.stories]
    total_turns = workload.turns
    say(f"workload: seed {cfg.seed}, {len(workload.stories)} stories ("
        f"{len(workload.shared_keys)} Conversations on a chain's key), {total_turns} turn sends; "
        f"keyspace {settings.keyspace}, topics {settings.topic_prefix}*, out {out}")
    # The run drops its keyspace at its end, or when its migrate fails: only one this run
    # made, so it makes it first and refuses one that exists (session 48).
    _make_keyspace(settings, say)
    # A setup failure was a traceback (CalledProcessError, RegistryUnavailable, ...) and
    # exit 1, a violation's code (an operator's review, session 46).
    try:
        migrated = subprocess.run([sys.executable, "-m", "ratchet.cli", "migrate"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except BaseException:
        # Ctrl-C stops migrate too, perhaps after it made the keyspace: it left as the
        # failed migrate's below did before session 47 (an outside review, session 47).
        say(_drop_keyspace(settings) or f"dropped keyspace {settings.keyspace} (if made)")
        raise
    if migrated.returncode != 0:
        # Its last line says why (docs/operations.md). No topic exists yet; the keyspace
        # does when migrate stopped after making it (a statement refused, the lease
        # not taken): it was left behind (session 46's review, left). It is this run's
        # (``_make_keyspace`` made it), so it is dropped, or the run says it may be left.
        lines = migrated.stderr.strip().splitlines() or [f"exit {migrated.returncode}"]
        say(_drop_keyspace(settings) or f"dropped keyspace {settings.keyspace} (if made)")
        raise ChaosSetupFailed(lines[-1])
    cluster = Cluster(settings, env, out, cfg.workers)
    # The topics the run deletes at its end: those it made (session 48; it deleted every
    # topic named ``chaos-<tag>...``).
    made: list[str] = []
    try:
        _make_topics(settings, f"chaos-{tag}", made)
        _start(settings, cluster, out)
    except BaseException:
        cluster.stop()
        _cleanup(settings, made, f"chaos-{tag}", say)
        raise
    try:
        return _run(settings, cfg, tag, out, workload, expectations, cluster, t0, t0_wall, say)
    finally:
        cluster.stop()
        _heal_servers(settings, say)
        _cleanup(settings, made, f"chaos-{tag}", say)


def _make_topics(settings: Settings, group: str, made: list[str]) -> None:
    """``run_topics.make``; a refusal or a Kafka that cannot be reached is
    ``ChaosSetupFailed`` (the keyspace and the topics made so far are removed)."""
    from ratchet.startup import explain

    try:
        run_topics.make(settings, group, made)
    except run_topics.TopicsNotMade as exc:
        raise ChaosSetupFailed(str(exc)) from exc
    except Exception as exc:
        raise ChaosSetupFailed(explain(exc, settings) or _short(exc)) from exc


def _start(settings: Settings, cluster: Cluster, out: Path) -> None:
    """Register the record schemas, start the workers and the API and wait until they
    serve; ``ChaosSetupFailed`` when a server cannot be reached or they never do."""
    from ratchet.startup import explain

    try:
        register_schemas(registry_client(settings.schema_registry_url))
    except Exception as exc:
        line = explain(exc, settings)
        if line is None:
            raise
        raise ChaosSetupFailed(line) from exc
    cluster.start()
    try:
        _wait_topics(settings)
    except RuntimeError as exc:
        raise ChaosSetupFailed(f"{exc}: the workers did not start; see "
                               f"{out / 'logs'}/worker-*.log") from exc
    if not cluster.wait_api():
        raise ChaosSetupFailed(f"the API did not become ready; see {out / 'logs' / 'api.log'}")


def damage_plan(expectations, seed: int, overdue: Violation | None, undecided: list,
                say=print) -> list:
    """The damage phase's plan (``damage.plan``), none when the run ended with a turn
    undecided (past its send deadline, or its drain's): the plan damages turns the
    oracle expects promoted, and a turn never sent has no row. Seed 3 of session 45's
    soak failed ``run_deadline`` and then ended in ``damage.apply``'s traceback (no
    report, no verdict) instead of its ``FAIL``."""
    if overdue is not None or undecided:
        say(f"damage: skipped, the run ended with {len(undecided)} responses undecided"
            + (" past its send deadline" if overdue is not None else ""))
        return []
    return damage.plan(expectations, seed)


def _run(settings, cfg, tag, out, workload, expectations, cluster, t0, t0_wall, say):
    say(f"{cfg.workers} workers and the API are up")
    reader = OutputReader(settings, group=f"chaos-check-{tag}")
    reader.start()
    fp_hash = workload_fp_hash()
    surely = _surely_promoted(expectations)
    ctx = multiprocessing.get_context("spawn")
    sent, stop = ctx.Value("l", 0), ctx.Value("b", 0)
    total = workload.turns

    def pick(rng: random.Random):
        if not surely:
            return None
        i = int(sent.value / max(total, 1) * len(surely)) + rng.randint(0, 20)
        return surely[min(i, len(surely) - 1)]

    waiters = Waiters(cluster.base_url, fp_hash, pick, reader.obs)
    waiters.start()
    pcfg = {"seed": cfg.seed, "turns": cfg.turns, "tag": tag, "producers": cfg.producers,
            "rate": cfg.rate, "out": str(out), "env": settings.to_env()}
    procs = [ctx.Process(target=produce_run, args=(pcfg, i, sent, stop), daemon=True)
             for i in range(cfg.producers)]
    for p in procs:
        p.start()
    prober = timed.Prober(cluster.base_url, out)  # reads of expiries passing in the run
    prober.start()
    plan = list(PROFILES[cfg.faults])
    random.Random(f"plan:{cfg.seed}").shuffle(plan)
    faults = FaultInjector(cluster, plan, cfg.seed, t0, cfg.fault_gap_s, cfg.faults_start_s, say,
                           # (an empty plan, --faults none, went round and round, a
                           # core busy while the producers were alive)
                           repeat_while=lambda: bool(plan) and cfg.faults != "ci"
                           and any(p.is_alive() for p in procs))
    faults.start()
    needed = _needed(expectations)
    last = 0.0
    drain_deadline = None
    budget = send_budget_s(cfg, len(plan))
    if budget + cfg.drain_timeout_s >= REUSE_TTL_MS / 1000 / 2:
        raise RuntimeError(f"a run of up to {budget + cfg.drain_timeout_s:.0f} s outlives "
                           f"half the workload's artifacts ({REUSE_TTL_MS // 1000} s)")
    say(f"sending must end within {budget:.0f} s of the start, the drain within "
        f"{cfg.drain_timeout_s:.0f} s after it")
    overdue: Violation | None = None
    undecided: list = []
    while True:
        time.sleep(1)
        producing = any(p.is_alive() for p in procs)
        injecting = faults.is_alive()
        if (producing or injecting) and overdue is None and time.monotonic() - t0 > budget:
            overdue = Violation("run_deadline", "-", (
                f"{time.monotonic() - t0:.0f} s after the start, past the send deadline "
                f"({budget:.0f} s), {sent.value}/{total} turns sent, producers "
                f"{'still sending' if producing else 'done'}, faults "
                f"{'still injecting' if injecting else 'done'}: a round failing again and "
                f"again? (the producers' 'round failed' lines)"))
            say(f"RUN DEADLINE: {overdue.detail}")
            faults.stop.set()
            say("; ".join(stop_producers(procs, stop)))
            continue
        if reader.failure is not None and overdue is None:
            # Every outcome from here on would read "never decided": stop, and say why.
            overdue = observer_violations(reader)[0]
            say(f"OBSERVER DIED: {overdue.detail}")
            faults.stop.set()
            say("; ".join(stop_producers(procs, stop)))
            break
        cluster.revive(time.monotonic() - t0)
        with reader.lock:
            undecided = [k for k, need in needed.items()
                         if not _is_decided(need, reader.decided.get(k, set()),
                                            reader.counts.get(k, 0))]
            decided = len(needed) - len(undecided)
        dl_done = len(reader.obs.dead_letters) >= _dead_letters(expectations)
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            alive = sum(w.alive() for w in cluster.workers)
            say(f"progress: sent {sent.value}/{total} turns, decided {decided}/{len(needed)} "
                f"responses, {reader.records} outcome records, faults {len(faults.records)}/"
                f"{len(plan)}, workers alive {alive}/{cfg.workers}, waits {waiters.counts}")
        if producing or injecting:
            continue
        if decided >= len(needed) and dl_done:
            break
        # Failed already (run_deadline): what was never sent is never decided.
        drain_deadline = drain_deadline or time.monotonic() + (
            min(cfg.drain_timeout_s, 30) if overdue else cfg.drain_timeout_s)
        if time.monotonic() > drain_deadline:
            say(f"drain deadline passed with {len(needed) - decided} responses undecided: "
                + ", ".join(f"{rid} of {tenant} ({reader.counts.get((tenant, rid), 0)} "
                            f"records, seen {sorted(map(str, reader.decided.get((tenant, rid), ())))})"
                            for tenant, rid in undecided[:5]))
            break
    waiters.close()
    time.sleep(3)  # let the reader take the last records (re-emitted outcomes, orphans)
    stamps = timed.read_stamps(out)
    timed.wait_past(stamps, say)  # the reads below are judged as past every expiry
    if not cluster.wait_api():
        say("the API is not ready; histories will be missing")
    say("reading histories over HTTP ...")
    # Every response sent, promoted or not: one never promoted must be a failure.
    responses = sorted(needed)
    convs = sorted({(e.story.tenant, e.story.key) for e in expectations
                    if e.story.kind == "conversation"})
    fetch_histories(cluster.base_url, fp_hash, responses, convs, reader.obs)
    cross = crosstenant.jobs(expectations, responses, convs)
    crosstenant.read(cluster.base_url, fp_hash, cross, tag, reader.obs)
    say(f"read {len(reader.obs.cross_reads)} of {len(cross)} ids as another tenant")
    # Damaged rows (docs/chaos.md): after every other read, in this run's keyspace only.
    reader.obs.damages = damage_plan(expectations, cfg.seed, overdue, undecided, say)
    damage.apply(settings, reader.obs.damages, cfg.seed, say)
    damage.read(cluster.base_url, fp_hash, reader.obs.damages, expectations,
                crosstenant.foreign_picker(expectations), reader.obs)
    conts = damage.continuations(expectations, reader.obs.damages)
    reader.obs.continuations = [c for c, _ in conts]

    def decided(tenant: str, rid: str) -> bool:
        with reader.lock:
            return bool(reader.decided.get((tenant, rid)))

    damage.send_continuations(settings, [ev for _, ev in conts], decided, say)
    time.sleep(2)  # the API's pre-warmer takes the promotions too
    damage.read_continuations(cluster.base_url, fp_hash, reader.obs.continuations, reader.obs)
    say(f"damage: {len(reader.obs.damages)} partitions damaged, "
        f"{len(reader.obs.damage_reads)} reads after it")
    reader.stop.set()
    reader.join(10)
    reader.obs.claim_answers_wrong.extend(_claims_wrong(out))
    prober.close()
    timed.settle(expectations, stamps, reader.obs)
    timed_waits = timed.take_waits(reader.obs, stamps)
    reader.obs.fault_windows = fault_windows(faults, t0_wall, time.monotonic() - t0)
    violations = judged(overdue, observer_violations(reader), lambda: check(expectations,
                                                                            reader.obs))
    timed_violations, timed_counts = timed.judge(expectations, stamps,
                                                 [*prober.reads, *timed_waits])
    violations += timed_violations + timed.recipe_violations(workload)
    say(f"timed turns: {len(stamps)} stamped; their reads judged {timed_counts}")
    report = _report(cfg, tag, out, workload, expectations, reader, faults, waiters, cluster.exits,
                     violations, time.monotonic() - t0, sent.value)
    report["timed"] = {"stamped": len(stamps), "reads": timed_counts}
    report["damage"] = {
        "damaged": [{"kind": d.kind, "response_id": d.response_id, "partition": d.partition,
                     "mode": "conversation" if d.conversation else "chain",
                     "through": len(d.through)} for d in reader.obs.damages],
        # what each kind of read answered, e.g. "history no-cache: failure/CORRUPT_HISTORY"
        "reads": dict(sorted(Counter(
            f"{r.what}{'' if r.cached else ' no-cache'}: " + (
                "/".join(str(x) for x in r.answer[:2]) if isinstance(r.answer, tuple)
                else f"{r.answer.outcome}/{r.answer.reason}")
            for r in reader.obs.damage_reads).items())),
    }
    # Each damaged turn's own answers, per kind: what the docs do not settle (a deleted
    # turn's; the status of a damaged items cell) shows here (docs/chaos.md).
    own = {(d.tenant, d.response_id): f"{d.kind} ({'conversation' if d.conversation else 'chain'})"
           for d in reader.obs.damages}
    report["damage"]["own"] = {}
    for r in reader.obs.damage_reads:
        if (r.tenant, r.ident) in own and r.what != "foreign":
            answer = ("/".join(str(x) for x in r.answer[:2]) if isinstance(r.answer, tuple)
                      else f"{r.answer.outcome}/{r.answer.reason}")
            report["damage"]["own"].setdefault(own[(r.tenant, r.ident)], []).append(
                f"{r.what}{'' if r.cached else ' no-cache'}: {answer}")
    decisions = {}
    for rec in (*reader.obs.promoted, *reader.obs.rejected):
        decisions.setdefault((rec.tenant, rec.response_id), set()).add(
            "promoted" if rec.sig[0] == "P" else f"rejected {rec.sig[1]}")
    report["damage"]["continuations"] = dict(Counter(
        f"{c.kind}: {'|'.join(sorted(decisions.get(c.event_key, {'undecided'})))}"
        for c in reader.obs.continuations))
    report["cross_tenant"] = dict(Counter(r.what for r in reader.obs.cross_reads))
    sent_at = _sent_times(out)
    decided_at = _decided_times(reader)
    if reporting.plot(out / "chaos.png", sent_at, decided_at, t0_wall, report["faults"]):
        report["plot_path"] = str(out / "chaos.png")
    reporting.write(report, out)
    print(reporting.summary(report), flush=True)
    return report


def judged(overdue: Violation | None, observer: list[Violation],
           check: Callable[[], list[Violation]]) -> list[Violation]:
    """The run's violations: its deadline's, the observer's (``observe.
    observer_violations``), then the checks'; not the checks' when the reader died:
    what it never saw would be judged "never decided", a verdict on the product from
    a harness failure."""
    first = [v for v in ([overdue] if overdue else []) if v.kind != "observer_died"]
    died = any(v.kind == "observer_died" for v in observer)
    return first + observer + ([] if died else check())


# Faults that leave the API and its servers alone: the API answers through them, so they
# excuse no lost answer.
WORKER_FAULTS = frozenset({"worker_kill", "zombie"})


def fault_windows(faults: FaultInjector, t0_wall: float, now_s: float) -> list[tuple[int, int]]:
    """The span of each fault that may cost the API an answer (a restart of the API or
    of a server, a paused Cassandra; not WORKER_FAULTS), in epoch ms: the checker
    excuses an answer lost in one. A fault still in progress spans to ``now_s``."""
    spans = [(f.start_s, f.end_s) for f in faults.records if f.name not in WORKER_FAULTS]
    if faults.is_alive():
        spans.append((spans[-1][1] if spans else 0.0, now_s))
    return [(int((t0_wall + a) * 1000), int((t0_wall + b) * 1000)) for a, b in spans]


def _report(cfg, tag, out, workload, expectations, reader, faults, waiters, unexpected,
            violations, duration, sent) -> dict[str, Any]:
    expected: dict[str, int] = {}
    for e in expectations:
        for acc in e.worlds[0].decided.values():
            sig = min(acc, key=str)
            name = "promoted" if sig[0] == "P" else sig[1]
            expected[name] = expected.get(name, 0) + 1
    grouped = reporting.group(violations)
    fault_dicts = [f.as_dict() for f in faults.records]
    return {
        "seed": cfg.seed, "tag": tag, "duration_s": duration, "workers": cfg.workers,
        "producers": cfg.producers, "rate": cfg.rate, "fault_profile": cfg.faults,
        "events": {"sent_turns": sent, "planned_turns": workload.turns,
                   "stories": len(workload.stories),
                   # Conversations whose id is a chain's first response id (one partition)
                   "shared_keys": len(workload.shared_keys),
                   "responses": len(_needed(expectations)),
                   "dead_letter_records": _dead_letters(expectations)},
        "observed": {"promoted": len(reader.obs.promoted), "rejected": len(reader.obs.rejected),
                     "orphaned": len(reader.obs.orphaned),
                     "dead_letters": len(reader.obs.dead_letters),
                     "histories": len(reader.obs.histories),
                     # requests the API never answered, per endpoint (excused only
                     # inside a fault window: ``answer_missing``)
                     "lost_answers": dict(Counter(x.what for x in reader.obs.lost))},
        "expected_outcomes": expected,
        "waits": dict(waiters.counts),
        "faults": fault_dicts,
        "faults_failed": [f["name"] for f in fault_dicts if not f["ok"]],
        "unexpected_exits": unexpected,
        "violations": grouped,
        "passed": not violations,
        "report_path": str(out / "chaos-report.json"),
        "repeat": f"ratchet chaos --seed {cfg.seed} --turns {cfg.turns} --rate {cfg.rate:g} "
                  f"--producers {cfg.producers} --workers {cfg.workers} --faults {cfg.faults}",
    }


def _needed(expectations: list[Expectation]) -> dict[tuple[str, str], tuple[list, int]]:
    """Per response: the acceptable outcomes of each of its sends in every world, and how
    many outcome records (one per event sent) must be seen before it counts as decided
    (``_is_decided``)."""
    needed: dict[tuple[str, str], tuple[list, int]] = {}
    for e in expectations:
        sends = sends_per_response(e)
        per_world: dict[tuple[str, str], list[list[frozenset]]] = {}
        for n, w in enumerate(e.worlds):
            for index, acc in w.decided.items():
                ev = e.story.events[index]
                worlds = per_world.setdefault((ev.tenant_id, ev.response_id),
                                              [[] for _ in e.worlds])
                worlds[n].append(acc)
        for key, worlds in per_world.items():
            needed[key] = (worlds, sends[key])
    return needed


def _is_decided(need: tuple[list, int], seen: set, records: int) -> bool:
    """Every send has its record, and in some world every send's acceptable outcomes
    include one seen (two sends may be answered alike: counting distinct outcomes
    would wait for one that never comes)."""
    worlds, sends = need
    return records >= sends and any(accs and all(acc & seen for acc in accs)
                                    for accs in worlds)


def _dead_letters(expectations: list[Expectation]) -> int:
    return len({(r.key, r.value) for e in expectations for r in e.dead_letters})


def _surely_promoted(expectations: list[Expectation]) -> list[tuple[str, str]]:
    """The responses the ``wait_ms`` threads ask: promoted in every world, and answered
    with a history. A turn whose logical expiry passed before it was sent (the
    workload's ``expired``) is promoted, but its every read is the failure ``EXPIRED``:
    asked, it counts as a wait never answered with a history. Once every turn is sent
    the threads ask the last response of this list again and again; seed 5 of session
    45's soak had such a turn there and failed ``waits_unanswered`` on a correct run
    (14 090 waits outside faults, each answered ``EXPIRED``)."""
    out = []
    for e in expectations:
        common = set.intersection(*(set(w.promoted) for w in e.worlds)) if e.worlds else set()
        out += [(e.story.tenant, rid) for rid in sorted(common)
                if not any(w.promoted[rid].expired for w in e.worlds)]
    return out


def _sent_log(out: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(out.glob("sent-*.jsonl"))
            for line in path.read_text().splitlines()]


def _sent_times(out: Path) -> dict[tuple[str, str], float]:
    sent: dict[tuple[str, str], float] = {}
    for rec in _sent_log(out):
        if "rid" in rec:
            sent.setdefault((rec["tenant"], rec["rid"]), rec["t"])
    return sent


def _claims_wrong(out: Path) -> list[tuple[str, str, str]]:
    """Claims the producers saw answered against the claims API's rules."""
    return [(rec["tenant"], rec["effect_id"], rec["claim_wrong"])
            for rec in _sent_log(out) if "claim_wrong" in rec]


def _decided_times(reader: OutputReader) -> dict[tuple[str, str], float]:
    first: dict[tuple[str, str], float] = {}
    for rec in (*reader.obs.promoted, *reader.obs.rejected):
        key = (rec.tenant, rec.response_id)
        first[key] = min(first.get(key, rec.at_ms / 1000), rec.at_ms / 1000)
    return first


def _wait_topics(settings: Settings, timeout_s: float = 180.0) -> None:
    """The workers create the topics at start; the reader subscribes once they exist."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "log_level": 0})
    want = {settings.topic(t) for t in ("gateway-events", "checkpoints", "rejections",
                                         "orphaned-effects", "dead-letters")}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if want <= set(admin.list_topics(timeout=5).topics):
                return
        except Exception:  # broker not answering yet
            pass
        time.sleep(1)
    raise RuntimeError(f"topics {sorted(want)} not created within {timeout_s:.0f}s")


def _heal_servers(settings: Settings, say) -> None:
    """A run ends with every server healthy: start what a fault left down."""
    from infra import launcher

    bad = [n for n, s in launcher.status(settings).items() if not s.healthy]
    if bad:
        say(f"servers not healthy after the run: {bad}; starting them")
        launcher.up(settings, bad, out=lambda m: say(f"infra: {m}"))


def _cleanup(settings: Settings, made: list[str], topic_prefix: str, say) -> None:
    """Delete the topics the run made (``run_topics``) and drop its keyspace: a broker
    loads every partition at start, so leftovers of many runs slow every later start.
    What cannot be deleted is named with the command that deletes it, and so are the
    topics named ``<topic_prefix>...`` the run did not make (left alone: it deleted them
    too before session 48); a failure never hides the verdict."""
    try:
        failed, others = run_topics.delete(settings, made, topic_prefix)
    except Exception as exc:
        failed, others = list(made), []
        if made:
            say(f"cleanup: topics {', '.join(made)} may be left ({_short(exc)}): remove each "
                f"with {run_topics.delete_command(settings, '<name>')} once Kafka answers")
    else:
        for line in failed:
            say(f"cleanup: could not delete topic {line}")
        if others:
            say(f"cleanup: left topic(s) {', '.join(others)}: named {topic_prefix}... but "
                "not made by this run")
    dropped = [f"{len(made) - len(failed)} topics"] if made else []
    left = _drop_keyspace(settings)
    if left:
        say(left)
    else:
        dropped.append(f"keyspace {settings.keyspace}")
    if dropped:
        say(f"dropped {' and '.join(dropped)}")


def _make_keyspace(settings: Settings, say) -> None:
    """Create the run's keyspace (``CREATE KEYSPACE`` without ``IF NOT EXISTS``), so that
    what the run drops is what it made. It trusted the name, ``chaos_<seed>x<6 hex>``: a
    keyspace of that name made before the run (a tag's collision, by hand) was used, and
    dropped when the run's migrate failed or at its end (session 47's review, left;
    session 48). One that exists is ``ChaosSetupFailed``, nothing used or dropped; a
    create that was sent but not answered may have made it: named, not dropped."""
    import logging

    from cassandra import AlreadyExists

    from ratchet.startup import explain
    from services.cassandra_cluster import open_cluster

    ks = settings.keyspace
    logging.getLogger("cassandra").setLevel(logging.ERROR)
    cluster = open_cluster(settings)
    try:
        try:
            session = cluster.connect()
        except Exception as exc:  # nothing was sent: nothing made
            raise ChaosSetupFailed(explain(exc, settings) or _short(exc)) from exc
        try:
            session.execute(f"CREATE KEYSPACE {ks} WITH replication = {settings.replication}",
                            timeout=60)
        except AlreadyExists:
            # Made before the run, or by this run's own create sent again after it
            # applied (its answer lost): which cannot be told, so it is neither used nor
            # dropped, and named with its drop (session 48's review, left; session 49).
            raise ChaosSetupFailed(
                f"keyspace {ks} exists already: made before this run (its tag met an "
                "earlier run's, or a hand made it) or by this run's own create, sent again "
                "after it applied; not used or dropped, nothing was changed. Run again (a "
                f"new tag); once sure no other run uses it, remove it with `DROP KEYSPACE "
                f"IF EXISTS {ks};`") from None
        except BaseException as exc:
            say(f"keyspace {ks} may have been made ({_short(exc)}): remove it with "
                f"`DROP KEYSPACE IF EXISTS {ks};` once sure it is this run's")
            if isinstance(exc, Exception):
                raise ChaosSetupFailed(explain(exc, settings) or _short(exc)) from exc
            raise
    finally:
        cluster.shutdown()


def _drop_keyspace(settings: Settings) -> str | None:
    """Drop the run's keyspace; None when dropped (or never made), else the line saying
    it may be left and how to drop it (Cassandra could not be asked)."""
    import logging

    from services.cassandra_cluster import open_cluster

    ks = settings.keyspace
    logging.getLogger("cassandra").setLevel(logging.ERROR)
    try:
        cluster = open_cluster(settings)
        try:
            cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
        finally:
            cluster.shutdown()
    except Exception as exc:
        return (f"cleanup: keyspace {ks} may be left ({_short(exc)}): remove it with "
                f"`DROP KEYSPACE IF EXISTS {ks};` (cqlsh) once Cassandra answers")
    return None


def _short(exc: BaseException) -> str:
    """An exception in a line of at most 200 characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 200 else text[:197] + "..."
