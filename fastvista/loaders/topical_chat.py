"""Topical-Chat (Gopalakrishnan et al., 2019) conversations with their reading sets.

`path` is `conversations/<split>.json` of the published layout; the reading set is read from
`reading_sets/pre-build/<split>.json` and Wikipedia lead sections from `src/wiki/wiki.json`.
One agent plays the assistant (`assistant`), or with `assistant="both"` every turn is an
assistant turn grounded in its own agent's reading set: Topical-Chat's two agents both read
knowledge, so a conversation then has ~20 scored turns (the speed scaling curve's long
dialogues, docs/speed.md); each turn's `meta` names its agent and the id ends in `#both`. A
turn's reference is the wiki section of each `FS*` entity it
cites; fun facts (Reddit) and articles (`AS*`) cannot be resolved offline, so a turn citing only
those or `Personal Knowledge` has no reference and is left as context unless `score_unreferenced`.
Each turn keeps its `knowledge_source` in `meta`. No faithfulness labels.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastvista.records_io import RecordError
from fastvista.schema import Dialogue, Turn

from .common import expect, guarded

WIKI_KEYS = ("shortened_wiki_lead_section", "summarized_wiki_lead_section")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(path, None, None, f"cannot read: {e}") from None
    return expect(path, None, None, data, dict, "a JSON object")


def _sections(path: Path, wiki: dict) -> dict[tuple[str, str], str]:
    """wiki.json maps text -> id per key; the reading sets cite ids."""
    tables = {k: expect(path, None, k, wiki.get(k, {}), dict, "an object of text -> id") for k in WIKI_KEYS}
    return {(k, str(v)): text for k, table in tables.items() for text, v in table.items()}


def load(path, assistant: str = "agent_2", score_unreferenced: bool = False):
    if assistant not in ("agent_1", "agent_2", "both"):
        raise ValueError(f"topical_chat option assistant={assistant!r}: agent_1, agent_2 or both")
    path = Path(path)
    root = path.parent.parent
    try:
        conversations = _read_json(path)
        reading_sets = _read_json(root / "reading_sets" / "pre-build" / path.name)
        wiki_path = root / "src" / "wiki" / "wiki.json"
        sections = _sections(wiki_path, _read_json(wiki_path))
    except RecordError as e:
        yield e
        return
    for conv_id, conv in conversations.items():
        yield from guarded(
            path, None, conv_id, lambda: [_dialogue(path, conv_id, conv, reading_sets, sections, assistant, score_unreferenced)]
        )


def _reference(path, conv_id, agent_set: dict, sources: list[str], sections: dict) -> str | None:
    texts = []
    for source in sources:
        fact_set = agent_set.get(source) if source.startswith("FS") else None
        if fact_set is None:
            continue
        key = next((k for k in WIKI_KEYS if k in fact_set), None)
        if key is None:
            continue
        text = sections.get((key, str(fact_set[key])))
        if text is None:
            raise RecordError(path, None, f"{conv_id}.{source}.{key}", f"id {fact_set[key]} not in wiki.json")
        texts.append(f"{fact_set.get('entity', source)}: {text}")
    return "\n".join(texts) or None


def _dialogue(path, conv_id, conv, reading_sets, sections, assistant, score_unreferenced) -> Dialogue:
    if conv_id not in reading_sets:
        raise RecordError(path, None, conv_id, "no reading set for this conversation")
    expect(path, None, conv_id, conv, dict, "a conversation object")
    turns = []
    for i, t in enumerate(expect(path, None, f"{conv_id}.content", conv.get("content") or [], list, "a list of turns")):
        where = f"{conv_id}.content[{i}]"
        if not (isinstance(t, dict) and isinstance(t.get("agent"), str) and isinstance(t.get("message"), str)):
            raise RecordError(path, None, where, "needs agent and message strings")
        agent, text = t["agent"], t["message"]
        sources = expect(path, None, f"{where}.knowledge_source", t.get("knowledge_source") or [], list, "a list of sources")
        meta = {"knowledge_source": sources, **({"agent": agent} if assistant == "both" else {})}
        if assistant != "both" and agent != assistant:
            turns.append(Turn(role="user", text=text, meta=meta))
            continue
        reference = _reference(path, conv_id, reading_sets[conv_id].get(agent, {}), sources, sections)
        turns.append(
            Turn(
                role="assistant",
                text=text,
                reference=reference,
                score=None if reference or score_unreferenced else False,
                meta=meta,
            )
        )
    if not turns:
        raise RecordError(path, None, f"{conv_id}.content", "empty conversation")
    return Dialogue(
        id=f"topical_chat-{path.stem}-{conv_id}" + ("#both" if assistant == "both" else ""),
        source=f"topical_chat/{path.stem}",
        turns=turns,
        meta={"config": conv.get("config"), "rating": conv.get("conversation_rating")},
    )
