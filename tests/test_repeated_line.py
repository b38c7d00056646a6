"""Ending a looping answer at its first repeated line: where the rule fires, and how it touches the logits."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastvista.labels import Label
from fastvista.schema import Claim
from fastvista.single_pass import ANSWER_STYLES, render_target
from fastvista.text import normalise_claim
from tests.test_single_pass import claim_text

torch = pytest.importorskip("torch")
repeated_line = pytest.importorskip("fastvista.llm.repeated_line")
END = 0


class Chars:
    """A tokenizer whose tokens are the given pieces of text (ids from 1; 0 is the end)."""

    def __init__(self):
        self.pieces = {}

    def ids(self, *pieces: str) -> list[int]:
        return [self.pieces.setdefault(p, len(self.pieces) + 1) for p in pieces]

    def text(self, i: int) -> str:
        return next(p for p, j in self.pieces.items() if j == i)

    def watcher(self, numbered: bool = True):
        return repeated_line._Watcher(lambda ids: "".join(map(self.text, ids)), self.text, stop_ids=[END], numbered=numbered)


def fires(watcher, ids: list[int], logits=None) -> list[bool]:
    """At each step of a stream of tokens, whether the watcher allows only the end."""
    logits = torch.zeros(200) if logits is None else logits
    out = []
    for k in range(1, len(ids) + 1):
        after = watcher(ids[:k], logits)
        out.append(bool(torch.isinf(after[1:]).all()))
    return out


def test_a_line_said_again_with_another_number_ends_the_answer_once_it_is_whole():
    tok = Chars()
    ids = tok.ids("1. Paris is in France. | VERIFIED", "\n", "2. Rome is in Italy. | OUT_OF_SCOPE", "\n",
                  "3. Paris is in France. | VERIF", "IED")
    assert fires(tok.watcher(), ids) == [False] * 5 + [True]
    # the same claim with another label is another line
    other = tok.ids("1. Paris is in France. | VERIFIED", "\n", "2. Paris is in France. | CONTRADICTED")
    assert fires(tok.watcher(), other) == [False] * 3


def test_plain_lines_compare_whole_so_a_claim_that_begins_with_a_number_is_not_a_repeat():
    """In the coded answer "2. " belongs to the claim: only the same whole line ends the answer."""
    tok = Chars()
    ids = tok.ids("Paris is in France. | V", "\n", "2. Paris is in France. | V", "\n", "Paris is in France. | V")
    assert fires(tok.watcher(numbered=False), ids) == [False] * 4 + [True]
    assert fires(tok.watcher(numbered=True), ids)[2]  # numbered, the second line would repeat the first


def test_the_request_names_how_its_lines_compare():
    processor = repeated_line.EndOnRepeatedLine.__new__(repeated_line.EndOnRepeatedLine)
    processor.decode = processor.piece = str

    def watcher(extra_args):
        return processor.new_req_logits_processor(type("Params", (), {"extra_args": extra_args, "all_stop_token_ids": {END}}))

    numbered, plain = (repeated_line.REPEATED_LINE_ARGS[s] for s in ("numbered", "plain"))
    assert watcher(None) is None and watcher({}) is None and watcher({"other": 1}) is None
    assert watcher({plain: 1}).key("2. A | V") == "2. A | V"
    assert watcher({numbered: 1}).key("2. A | V") == "A | V"  # also what a client of the first version sent
    assert watcher({numbered: 1, plain: 1}) is None  # asked both ways: the answer is written whole


def test_a_newline_inside_a_token_splits_the_lines_where_the_text_does():
    tok = Chars()
    ids = tok.ids("1. A | VERIF", "IED\n2", ". B | VERIFIED", "\n3. A", " | VERIFIED")
    assert fires(tok.watcher(), ids) == [False, False, False, False, True]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(Claim, text=claim_text, label=st.sampled_from(list(Label))), max_size=12), st.sampled_from(["numbered", "coded", "worded"]))
def test_an_answer_without_repeated_claims_is_never_ended_early(cs, answer):
    """The student's lines end with a label and no label begins another: at no character of an
    answer whose claim lines are all distinct does the rule fire; on a repeat, it fires the
    moment the repeated label is whole. In either answer style, compared as the student asks."""
    seen, distinct = set(), []
    for c in cs:
        if (normalise_claim(c.text), c.label) not in seen:
            seen.add((normalise_claim(c.text), c.label))
            distinct.append(c)
    tok, numbered = Chars(), ANSWER_STYLES[answer].numbered
    written = list(render_target(distinct, answer))
    assert not any(fires(tok.watcher(numbered), tok.ids(*written)))
    if distinct:
        looped = list(render_target([*distinct, distinct[0]], answer))
        assert fires(tok.watcher(numbered), tok.ids(*looped))[-2:] == [False, True]


def test_the_end_is_never_forced_where_the_format_forbids_it():
    """Where the structured-output grammar has masked the end token, the answer goes on: it stays
    in its format (a wasted line, never a broken answer)."""
    tok = Chars()
    ids = tok.ids("1. A | VERIFIED", "\n", "2. A | VERIFIED")
    masked = torch.zeros(10)
    masked[END] = float("-inf")
    assert fires(tok.watcher(), ids, masked) == [False] * 3
    ended = tok.watcher()(ids, torch.arange(10.0))
    assert ended[END] == 0.0 and torch.isinf(ended[1:]).all() and (ended[1:] < 0).all()


def test_a_watcher_that_fails_leaves_its_answer_whole_and_the_engine_running():
    w = repeated_line._Watcher(lambda ids: 1 / 0, lambda i: "x", stop_ids=[END])
    logits = torch.arange(5.0)
    assert torch.equal(w([1, 2], logits), logits) and torch.equal(w([1, 2, 3], logits), logits)
