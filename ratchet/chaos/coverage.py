"""Coverage turns: what the contract defines an outcome for beyond the function-call
tool loop (the Responses item catalogue, turns without an artifact, truncated, with a
router receipt, with subturns, expiring, large). Each builder returns [(event index of
a TurnCompleted, whether it promotes)] and the oracle (ratchet/chaos/oracle.py)
predicts the outcome and every read from the event alone.
"""

from __future__ import annotations

import json
import random

from ratchet.chaos.story import WORDS, Story, StoryGateway
from schemas.models import Subturn
from services.gateway.events import TurnIdentity

COVERAGE_SCENARIOS = frozenset({"catalogue", "catalogue_client", "catalogue_unpaired",
                                "no_artifact", "truncated", "receipt", "subturns",
                                "expiring", "large"})
# Item groups of the catalogue (contracts.md section 7, docs/gateway-protocol.md section
# 5): self-contained items, and calls with the output of their own type.
SELF_CONTAINED = ("web_search", "file_search", "code_interpreter", "image_generation",
                  "mcp_list_tools", "mcp_call", "compaction")
CALL_KINDS = ("custom_tool", "computer", "local_shell", "shell", "apply_patch")
CLIENT_KINDS = (*CALL_KINDS, "mcp_approval")
UNPAIRED_CATALOGUE = ("wrong_output_type", "approval_unknown", "open_call_then_message",
                      "call_id_across_types", "approval_twice")
# How long after its send a timed turn's receipt, artifact or logical expiry passes.
TIMED_MS = 3000
TIMED_KINDS = ("receipt", "artifact", "logical")
# One story in LARGE_EVERY (at index LARGE_AT) sends a turn of about LARGE_BYTES of items
# (the contract promises 8 MiB; this is enough to catch a lowered bound, cheaply).
LARGE_EVERY, LARGE_AT, LARGE_BYTES = 40, 7, 1 << 20


def catalogue_call(rid: str, kind: str, n: int, rng: random.Random) -> dict:
    """The call (or approval request) of a ``CLIENT_KINDS`` group."""
    p, word = f"{rid}-{kind}-{n}", rng.choice(WORDS)
    cid = f"call-{p}"
    return {
        "custom_tool": {"type": "custom_tool_call", "id": f"ct-{p}", "call_id": cid,
                        "name": "grep", "input": word},
        "computer": {"type": "computer_call", "id": f"cc-{p}", "call_id": cid,
                     "action": {"type": "click", "x": 3, "y": 4, "button": "left"},
                     "pending_safety_checks": [], "status": "completed"},
        "local_shell": {"type": "local_shell_call", "id": f"ls-{p}", "call_id": cid,
                        "action": {"type": "exec", "command": ["ls", word], "env": {}},
                        "status": "completed"},
        "shell": {"type": "shell_call", "id": f"sh-{p}", "call_id": cid,
                  "action": {"commands": [f"grep {word}"]}, "status": "completed"},
        "apply_patch": {"type": "apply_patch_call", "id": f"ap-{p}", "call_id": cid,
                        "operation": {"type": "update_file", "path": f"{word}.txt",
                                      "diff": f"-{word}\n+{word}!"},
                        "status": "completed"},
        "mcp_approval": {"type": "mcp_approval_request", "id": f"ar-{p}",
                         "server_label": "docs", "name": "delete",
                         "arguments": json.dumps({"what": word})},
    }[kind]


def catalogue_answer(call: dict, rid: str, rng: random.Random) -> dict:
    """The item answering ``call`` (its type's output, or the approval response)."""
    if call["type"] == "mcp_approval_request":
        return {"type": "mcp_approval_response", "id": f"resp-of-{call['id']}-{rid}",
                "approval_request_id": call["id"], "approve": rng.random() < 0.5}
    out = {"type": call["type"] + "_output", "id": f"out-{call['id']}-{rid}",
           "call_id": call["call_id"]}
    if call["type"] == "computer_call":
        out["output"] = {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}
    elif call["type"] == "shell_call":
        out["output"] = [{"stdout": "ok", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
    else:
        out["output"] = f"done: {rng.choice(WORDS)}"
    return out


def catalogue_items(rid: str, kind: str, n: int, rng: random.Random) -> list[dict]:
    """One group of items of ``kind`` (a self-contained item, or a call and its answer)."""
    if kind in CLIENT_KINDS:
        call = catalogue_call(rid, kind, n, rng)
        return [call, catalogue_answer(call, rid, rng)]
    p, word = f"{rid}-{kind}-{n}", rng.choice(WORDS)
    return [{
        "web_search": {"type": "web_search_call", "id": f"ws-{p}", "status": "completed",
                       "action": {"type": "search", "query": word}},
        "file_search": {"type": "file_search_call", "id": f"fs-{p}", "status": "completed",
                        "queries": [word], "results": None},
        "code_interpreter": {"type": "code_interpreter_call", "id": f"ci-{p}",
                             "status": "completed", "code": f"print({word!r})",
                             "container_id": "cntr-chaos", "outputs": [{"type": "logs",
                                                                        "logs": word}]},
        "image_generation": {"type": "image_generation_call", "id": f"ig-{p}",
                             "status": "completed", "result": "aGVsbG8="},
        "mcp_list_tools": {"type": "mcp_list_tools", "id": f"ml-{p}", "server_label": "docs",
                           "tools": [{"name": "search", "input_schema": {"type": "object"}}]},
        "mcp_call": {"type": "mcp_call", "id": f"mc-{p}", "server_label": "docs",
                     "name": "search", "arguments": json.dumps({"q": word}), "output": word},
        "compaction": {"type": "compaction", "id": f"cp-{p}",
                       "encrypted_content": f"gAAAA-chaos-{word}"},
    }[kind]]


def _unpaired_catalogue(rid: str, how: str, rng: random.Random) -> list[dict]:
    """Output items that break one pairing rule of the catalogue (UNPAIRED_TOOL_CALL)."""
    if how == "wrong_output_type":  # a custom tool's output answering a function call
        call = {"type": "function_call", "id": f"fc-{rid}-w", "call_id": f"call-{rid}-w",
                "name": "get_weather", "arguments": "{}"}
        return [call, {"type": "custom_tool_call_output", "id": f"cto-{rid}-w",
                       "call_id": call["call_id"], "output": "sunny"}]
    if how == "approval_unknown":  # a response to a request nobody made
        return [{"type": "mcp_approval_response", "id": f"arr-{rid}-u",
                 "approval_request_id": f"ar-never-{rid}", "approve": True}]
    if how == "open_call_then_message":  # an open call, then the assistant's message
        return [catalogue_call(rid, rng.choice(CLIENT_KINDS), 0, rng)]
    if how == "approval_twice":  # one request answered twice
        call = catalogue_call(rid, "mcp_approval", 0, rng)
        answer = catalogue_answer(call, rid, rng)
        return [call, answer, {**answer, "id": answer["id"] + "-again"}]
    # One call id used by two call types.
    first = catalogue_items(rid, "custom_tool", 0, rng)
    second = catalogue_items(rid, "local_shell", 1, rng)
    cid = first[0]["call_id"]
    return first + [{**second[0], "call_id": cid}, {**second[1], "call_id": cid}]


def _large_output(rid: str, rng: random.Random) -> tuple[dict, ...]:
    """About ``LARGE_BYTES`` of assistant messages (16 items)."""
    size = LARGE_BYTES // 16
    out = []
    for n in range(16):
        words, total = [], 0
        while total < size:
            w = rng.choice(WORDS)
            words.append(w)
            total += len(w) + 1
        out.append({"type": "message", "role": "assistant", "id": f"big-{rid}-{n}",
                    "content": [{"type": "output_text", "text": " ".join(words)}]})
    return tuple(out)


def coverage_turns(story: Story, gw: StoryGateway, scenario: str, ident: TurnIdentity, key: str,
              text: str, head: int | None) -> list[tuple[int, bool, str]]:
    """Build one coverage scenario; ``head`` is the Conversation's (None in a chain).
    Returns (event index, whether it promotes, its request text) per turn."""
    rng, rid = gw.rng, ident.response_id
    if scenario == "catalogue":
        kinds = rng.sample((*SELF_CONTAINED, *CLIENT_KINDS), rng.randint(2, 4))
        items = [i for n, k in enumerate(kinds) for i in catalogue_items(rid, k, n, rng)]
        turn = gw.turn(ident, key, text, extra_output=tuple(items),
                       reasoning=rng.random() < 0.3)
        return [(story.add(scenario, turn)[0], True, text)]
    if scenario == "catalogue_client":
        # The model calls a tool the client runs (or asks an approval): the turn ends
        # with the open call, the next turn starts with its answer.
        kind = rng.choice(CLIENT_KINDS)
        call = catalogue_call(rid, kind, 0, rng)
        asked = story.add(scenario, gw.turn(ident, key, text, extra_output=(call,),
                                            final_message=False))[0]
        rid2, key2, text2 = gw.rid(), gw.key(), gw.text()
        answer = catalogue_answer(call, rid2, rng)
        nxt = gw.turn(gw.identity(rid2, head + 1), key2, text2, inputs=(answer,))
        return [(asked, True, text), (story.add(f"{scenario}_answer", nxt)[0], True, text2)]
    if scenario == "catalogue_unpaired":
        how = rng.choice(UNPAIRED_CATALOGUE)
        turn = gw.turn(ident, key, text, extra_output=tuple(_unpaired_catalogue(rid, how, rng)))
        return [(story.add(f"unpaired_{how}", turn)[0], False, text)]
    if scenario == "no_artifact":
        # Completed and certified, with no token artifact to reuse: reads fall back
        # NO_ARTIFACT with the whole history.
        return [(story.add(scenario, gw.turn(ident, key, text, with_artifact=False))[0], True, text)]
    if scenario == "truncated":
        # truncation=auto and the history was truncated: promoted logical_only.
        return [(story.add(scenario, gw.turn(ident, key, text, truncated=True))[0], True, text)]
    if scenario == "receipt":
        return [(story.add(scenario, gw.turn(ident, key, text, receipt=True))[0], True, text)]
    if scenario == "subturns":
        # Two gateway-tool rounds, each with its ephemeral artifact (never promoted) and
        # its effect, listed by its subturn only (the union of the lists is what counts).
        tools = [gw.tool_call(rid, n) for n in range(2)]
        effects = [gw.effect(ident, key, n, c, r) for n, (c, r) in enumerate(tools)]
        rounds = tuple(Subturn(index=n, ephemeral_artifact_ref=f"eph-{rid}-{n}",
                               effect_ids=(e.effect_id,)) for n, e in enumerate(effects))
        turn = gw.turn(ident, key, text, tools=tools, subturns=rounds)
        return [(story.add(scenario, *effects, turn)[-1], True, text)]
    if scenario == "expiring":
        what = rng.choice(TIMED_KINDS)
        turn = gw.turn(ident, key, text, receipt=what == "receipt")
        index = story.add(f"expiring_{what}", turn)[0]
        story.timed[index] = (what, TIMED_MS)
        return [(index, True, text)]
    assert scenario == "large"
    turn = gw.turn(ident, key, text, extra_output=_large_output(rid, rng))
    return [(story.add(scenario, turn)[0], True, text)]
