"""AIS (Rashkin et al., 2023) annotations of Wizard-of-Wikipedia responses.

The CSV holds no passage and no history: both come from WoW's `test_random_split.json`, which the
user supplies as `wow_file`. `ex-idx` is `episode:turn`, the turn indexing the episode's `dialog`
list at the wizard response the model replaced. `INT & AIS` 1 -> faithful, 0 -> hallucinated;
a response rated not interpretable (INT 0) keeps `gold.label` null.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastvista.records_io import RecordError
from fastvista.schema import Dialogue, Turn

from .common import binary_gold, csv_records, require

NEEDS_WOW = (
    "AIS rows hold no passage or history: pass Wizard of Wikipedia's test_random_split.json "
    "as wow_file (fastvista data convert ais ann_wow.csv --option wow_file=PATH -o OUT)"
)


def load(path, wow_file: str | None = None):
    if not wow_file:
        yield RecordError(path, None, "wow_file", NEEDS_WOW)
        return
    try:
        episodes = json.loads(Path(wow_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        yield RecordError(wow_file, None, None, f"cannot read the WoW file: {e}")
        return
    yield from csv_records(path, lambda line, row: [_record(path, line, row, episodes)])


def _record(path, line, row, episodes) -> Dialogue:
    ex = require(path, line, row, "ex-idx")
    try:
        episode, turn = (int(x) for x in ex.split(":"))
        dialog = episodes[episode]["dialog"]
        target = dialog[turn]
    except (ValueError, IndexError, KeyError, TypeError):
        raise RecordError(path, line, "ex-idx", f"{ex!r} is not an episode:turn of the WoW file") from None
    if not isinstance(target, dict):
        raise RecordError(path, line, "ex-idx", f"{ex!r} points at a {type(target).__name__}, not a turn of the WoW file")
    if "wizard" not in target.get("speaker", "").lower():
        raise RecordError(path, line, "ex-idx", f"{ex!r} points at a {target.get('speaker')!r} turn, not the wizard")
    checked = target.get("checked_sentence") or {}
    reference = " ".join(v for v in checked.values() if v and v != "no_passages_used") or None
    interpretable = row.get("INT", "").strip() == "1"
    ais = require(path, line, row, "INT & AIS")
    history = [
        Turn(role="assistant" if "wizard" in t["speaker"].lower() else "user", text=t["text"], score=False)
        for t in dialog[:turn]
    ]
    return Dialogue(
        id=f"ais-wow-{ex}-{row.get('model-name', 'model')}",
        source="ais/wow",
        system=row.get("model-name"),
        turns=history
        + [
            Turn(
                role="assistant",
                text=require(path, line, row, "output"),
                reference=reference,
                gold=binary_gold(ais == "0" if interpretable else None, f"INT={row.get('INT')} AIS={ais}"),
            )
        ],
    )
