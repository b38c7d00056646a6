"""Readable reports of scored dialogues: a terminal table and an HTML page with claims coloured
by label."""

from __future__ import annotations

import html
import unicodedata
from pathlib import Path

from fastvista.schema import ScoredDialogue

COLOURS = {
    "VERIFIED": "#d4f4dd",
    "OUT_OF_SCOPE": "#e8e8e8",
    "ABSTENTION": "#dde8f8",
    "CONTRADICTED": "#f8d0d0",
    "LACKING_EVIDENCE": "#fbe7c6",
}
STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;color:#222}
.turn{border-left:3px solid #aaa;padding:.3rem .8rem;margin:.6rem 0}.user{color:#555}
.claim{display:inline-block;border-radius:4px;padding:.1rem .4rem;margin:.15rem}
.bad{border-left-color:#c33}.meta{color:#777;font-size:.85rem}"""


def _plain(text: str):
    """Untrusted text for the terminal: a Text, so never read as markup (`[/]` must not crash the
    table, nor `[red]` style it), with control characters (ESC starts terminal commands) shown
    as escapes rather than sent, and so are format characters (bidi overrides reorder what
    follows them)."""
    from rich.text import Text

    return Text("".join(c.encode("unicode_escape").decode() if unicodedata.category(c) in ("Cc", "Cf") else c for c in text))


def terminal_table(scored: list[ScoredDialogue], limit: int = 20):
    """A rich Table: one row per dialogue (the first `limit`)."""
    from rich.table import Table

    table = Table(title=f"{len(scored)} dialogues scored")
    for column in ("dialogue", "system", "turns", "claims", "hallucinated turns", "score"):
        table.add_column(column, justify="left" if column in ("dialogue", "system") else "right")
    for d in scored[:limit]:
        table.add_row(
            _plain(d.id), _plain(d.system or ""), str(len(d.turns)), str(sum(len(t.claims) for t in d.turns)),
            str(sum(t.hallucinated for t in d.turns)), "none" if d.score is None else f"{d.score:.3f}",
        )
    return table


def _turn_html(d: ScoredDialogue, index: int) -> str:
    turn = d.dialogue.turns[index]
    result = next((r for r in d.turns if r.index == index), None)
    text = html.escape(turn.text)
    if result is None:
        return f'<div class="turn user"><b>{turn.role}</b>: {text}</div>'
    claims = "".join(
        f'<span class="claim" style="background:{COLOURS[c.label.value]}" title="{c.label.value}'
        f'{f" ({c.confidence:.2f})" if c.confidence is not None else ""}">{html.escape(c.text)} '
        f"<small>{c.label.value}</small></span>"
        for c in result.claims
    )
    score = f"score {result.score:.2f}"
    klass = "turn bad" if result.hallucinated else "turn"
    return f'<div class="{klass}"><b>assistant</b>: {text}<div>{claims}</div><div class="meta">{score}</div></div>'


def write_html(scored: list[ScoredDialogue], path: Path) -> None:
    legend = " ".join(f'<span class="claim" style="background:{c}">{l}</span>' for l, c in COLOURS.items())
    parts = [f"<!doctype html><meta charset=utf-8><title>fastvista report</title><style>{STYLE}</style>",
             f"<h1>fastvista report</h1><p>{len(scored)} dialogues. {legend}</p>"]
    for d in scored:
        parts.append(f"<h2>{html.escape(d.id)} <small class=meta>system {html.escape(str(d.system))}, score {'none' if d.score is None else f'{d.score:.3f}'}</small></h2>")
        parts.extend(_turn_html(d, i) for i in range(len(d.dialogue.turns)))
    path.write_text("\n".join(parts), encoding="utf-8")
