"""docs/decisions.md's "Where to look" index, held to the sections under it. The page is a
log of ~140 sections in no topical order; the index is how a newcomer or an operator
finds "why does the store do X". A section added without its index line, listed twice,
or renamed so that its line points at no heading fails here until the index says so.

Anchors are computed the way GitHub renders them: the heading's text lowercased, every
character that is not a letter, digit, underscore, space or hyphen dropped, each space
made a hyphen; a repeated anchor gets -1, -2, ... in the order the headings come."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "docs" / "decisions.md"
INDEX_HEADING = "Where to look"

_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_LINK = re.compile(r"\]\(#([^)\s]+)\)")
_ENTRY = re.compile(r"^- \[[^\]]+\]\(#[^)\s]+\):? +\S")


def heading_text(raw: str) -> str:
    """What GitHub renders of a heading's markdown: inline code and emphasis markers and
    a link's target go, their text stays."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return text.replace("`", "").replace("*", "")


def slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading_text(text).lower()).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of every heading outside fenced code, anchors made unique as
    GitHub makes them."""
    found: list[tuple[int, str, str]] = []
    seen: Counter[str] = Counter()
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        anchor = base if seen[base] == 0 else f"{base}-{seen[base]}"
        seen[base] += 1
        found.append((len(match.group(1)), match.group(2), anchor))
    return found


def index_block(text: str) -> str:
    """The index section's body, up to the next `## ` heading."""
    head = f"\n## {INDEX_HEADING}\n"
    assert head in text, f"docs/decisions.md has no '## {INDEX_HEADING}' section"
    return text.split(head, 1)[1].split("\n## ", 1)[0]


def problems(text: str) -> list[str]:
    """Everything wrong with the index against the page, one line each (empty: sound)."""
    all_headings = headings(text)
    anchors = {anchor for _, _, anchor in all_headings}
    sections = [(title, anchor) for level, title, anchor in all_headings
                if level == 2 and heading_text(title) != INDEX_HEADING]
    block = index_block(text)
    linked = Counter(_LINK.findall(block))
    found = []
    for title, anchor in sections:
        if linked[anchor] == 0:
            found.append(f"not in the index: {title!r} (#{anchor})")
        elif linked[anchor] > 1:
            found.append(f"listed {linked[anchor]} times: {title!r} (#{anchor})")
    for anchor in linked:
        if anchor not in anchors:
            found.append(f"points at no heading: #{anchor}")
    section_anchors = {anchor for _, anchor in sections}
    for anchor in linked:
        if anchor in anchors and anchor not in section_anchors:
            found.append(f"points at a heading that is no '## ' section: #{anchor}")
    for line in block.split("\n"):
        if _LINK.search(line) and not _ENTRY.match(line):
            found.append(f"not an entry '- [title](#anchor): what was decided': {line!r}")
    return found


def test_the_index_lists_every_section_once_and_only_real_ones():
    assert problems(DECISIONS.read_text()) == []


def test_anchors_are_githubs():
    text = "\n".join([
        "# Decisions",
        "## `RehydrationService` split by composition (2026-12-07, session 45)",
        "## migrate --status from the lease row, and the CLI on bad input",
        "## Two reviews from outside",
        "```",
        "## not a heading",
        "```",
        "## Two reviews from outside",
        "## Performance (issue 15/16): what's tried",
    ])
    assert [anchor for _, _, anchor in headings(text)] == [
        "decisions",
        "rehydrationservice-split-by-composition-2026-12-07-session-45",
        "migrate---status-from-the-lease-row-and-the-cli-on-bad-input",
        "two-reviews-from-outside",
        "two-reviews-from-outside-1",
        "performance-issue-1516-whats-tried",
    ]


PAGE = """# Decisions

## Where to look

- [A](#a): chosen.
{extra}
## A

## B
"""


def test_a_section_missing_twice_listed_or_dangling_is_named():
    sound = PAGE.format(extra="- [B](#b): chosen.\n")
    assert problems(sound) == []
    assert problems(PAGE.format(extra="")) == ["not in the index: 'B' (#b)"]
    assert problems(PAGE.format(extra="- [B](#b): chosen.\n- [B again](#b): again.\n")) == [
        "listed 2 times: 'B' (#b)"]
    assert problems(PAGE.format(extra="- [B](#b): chosen.\n- [C](#c): gone.\n")) == [
        "points at no heading: #c"]
    assert problems(PAGE.format(extra="- [B](#b)\n")) == [
        "not an entry '- [title](#anchor): what was decided': '- [B](#b)'"]
