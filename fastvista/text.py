"""Text helpers every prompt and parser shares: untrusted text kept as data, model answers read.

Dialogue text is untrusted: `escape_block` turns every Unicode line break into a newline and
escapes each line whose first visible character is an opening bracket of any shape (or the
escape character), so that no text can forge a section header of any prompt; `one_line` keeps a
text on one line. `reference_block`, `render_store` and `render_history` are the one rendering of a turn's
reference, a knowledge store and a dialogue history, in every prompt. Answers are
read with `earliest` (the first of the expected words wins) and, where log-probabilities are
given, with `first_token_distribution`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence

ESCAPE = "\\"
NONE = "none"
SPEAKERS = {"user": "User", "assistant": "Assistant"}


class FormatError(ValueError):
    """Model output that does not follow the format it was asked for."""


# Every line break a model or tokenizer may honour: exactly those of `str.splitlines`.
LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# Characters a reader or tokenizer may not see (BERT's tokenizer drops Cc and Cf): they must not
# hide what a line starts with.
_INVISIBLE = {"Cc", "Cf", "Mn", "Me"}


def split_lines(text: str) -> list[str]:
    """The lines of `text` as a model may read them (empty last line kept, unlike splitlines)."""
    return LINE_BREAK.split(text)


def _skip_invisible(text: str) -> str:
    i = 0
    while i < len(text) and (text[i].isspace() or unicodedata.category(text[i]) in _INVISIBLE):
        i += 1
    return text[i:]


def needs_escape(line: str) -> bool:
    """Could the line be read as a header or an escape: its first visible character, read as
    NFKC, is an opening bracket of any script (category Ps, so `[` and lookalikes) or `\\`."""
    head = _skip_invisible(unicodedata.normalize("NFKC", _skip_invisible(line)))
    return bool(head) and (unicodedata.category(head[0]) == "Ps" or head[0] == ESCAPE)


def escape_block(text: str) -> str:
    """Every line break as `\\n`, and every line that could pass for a header escaped."""
    return "\n".join(ESCAPE + l if needs_escape(l) else l for l in split_lines(text))


def one_line(text: str) -> str:
    """Collapse all whitespace, every Unicode line break included, to single spaces."""
    return " ".join(text.split())


def normalise_claim(text: str) -> str:
    """Claim text as the format allows it: one line, no `|`."""
    return one_line(text.replace("|", "/").replace("\uff5c", "/"))


def reference_block(reference: str | None) -> str:
    """A turn's reference as a prompt section's body: escaped, or `none`."""
    return escape_block(reference.strip()) if reference and reference.strip() else NONE


def turn_block(text: str) -> str:
    """A turn's (or any dialogue text's) body in a prompt section: escaped, or `none`."""
    return escape_block(text.strip()) or NONE


def earliest(text: str, words: dict[str, object], what: str = "answer"):
    """The value of whichever of `words` comes first in `text` as a whole word (case, spaces and
    hyphens aside: "lacking evidence" reads as LACKING_EVIDENCE; "no" is not read in "knowledge");
    FormatError when none does."""
    normalised = re.sub(r"[\s-]+", "_", text.upper())
    found = ((re.search(rf"(?<![A-Z0-9]){re.escape(w)}(?![A-Z0-9])", normalised), value) for w, value in words.items())
    hits = [(m.start(), value) for m, value in found if m]
    if not hits:
        raise FormatError(f"no {what} in {text[:80]!r}")
    return min(hits, key=lambda h: h[0])[1]


def first_token_distribution(completion, letters: dict[str, object]) -> dict | None:
    """The answers' probabilities at the first generated token that holds a letter: each of its
    top alternatives counts for the answer whose word it begins (`letters`: first letter ->
    answer, one letter per answer word, whatever the tokenizer). None without log-probabilities
    or when no alternative fits."""
    for step in completion.logprobs or []:
        if not any(ch.isalpha() for ch in step.token):
            continue
        mass: dict = {}
        for token, logprob in step.top.items():
            head = token.strip().lstrip("\"'*`_").upper()[:1]
            if head in letters:
                mass[letters[head]] = mass.get(letters[head], 0.0) + math.exp(logprob)
        total = sum(mass.values())
        return {k: v / total for k, v in mass.items()} if total > 0 else None
    return None

def render_store(store: Sequence[str]) -> str:
    if not store:
        return NONE
    return "\n".join(f"{i}. {normalise_claim(c)}" for i, c in enumerate(store, 1))

def render_history(history: Sequence[tuple[str, str]]) -> str:
    if not history:
        return NONE
    return "\n".join(f"{SPEAKERS[role]}: {one_line(text)}" for role, text in history)

def recent(history: Sequence[tuple[str, str]], history_turns: int) -> list[tuple[str, str]]:
    """The last `history_turns` entries (none for 0)."""
    return list(history[-history_turns:]) if history_turns else []
