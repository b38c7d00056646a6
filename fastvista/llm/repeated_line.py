"""Ending an answer at its first repeated line, inside vLLM.

A small model decoding greedily can loop: it writes one line again and again until its format's
last line. The student merges repeated claims, so those tokens are decoded for nothing: on the
shipped student a fifth of all decoding (docs/student.md). A request that asks for it
(`ChatRequest.end_on_repeated_line`) is ended by vLLM as soon as the line it is writing equals a
line it already ended: numbered lines without their "k. " (which changes on a repeat), plain
lines whole (in the coded answer a leading "3. " is claim text). The price: a looping answer
that would have gone on to a new line after its repeat ends without it (measured in
docs/student.md).

Only for formats in which no complete line is the beginning of a longer one: the student's lines
end with a label, and no label begins another. The end is forced only where the request's own
constraints allow the answer to end, so a constrained answer always stays in its format.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from fastvista.llm import REPEATED_LINE_ARGS

_NUMBERING = re.compile(r"^\d+\. ")


def _unnumbered(line: str) -> str:
    return _NUMBERING.sub("", line, count=1)


def _whole(line: str) -> str:
    return line


class _Watcher:
    """One request: ends it once the line it is writing repeats an ended one. Only the current
    line is decoded each step (a line ends at a token whose text holds a newline), so the cost
    does not grow with the answer; a character split across tokens decodes whole within its line."""

    def __init__(self, decode, piece, stop_ids: list[int], numbered: bool = True):
        self.decode, self.piece, self.stop_ids = decode, piece, stop_ids
        self.key = _unnumbered if numbered else _whole  # what of a line is compared
        self.read = self.line_start = 0  # tokens read; where the current line's tokens begin
        self.carry = ""  # the current line's text inside the token that ended the last line
        self.ended: set[str] = set()  # the ended lines' keys
        self.failed = False

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.failed:
            return logits
        try:
            return self._apply(output_ids, logits)
        except Exception as e:  # the engine serves every request: this one is decoded whole instead
            print(f"end_on_repeated_line: {type(e).__name__}: {e}; this answer is decoded whole", file=sys.stderr, flush=True)
            self.failed = True
            return logits

    def _apply(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        for i in range(self.read, len(output_ids)):
            if "\n" in self.piece(output_ids[i]):
                *lines, self.carry = (self.carry + self.decode(output_ids[self.line_start:i + 1])).split("\n")
                self.ended.update(self.key(line) for line in lines)
                self.line_start = i + 1
        self.read = len(output_ids)
        current = self.key(self.carry + self.decode(output_ids[self.line_start:]))
        if not current or current not in self.ended:
            return logits
        ends = logits[self.stop_ids]
        if not torch.isfinite(ends).any():  # the request's format cannot end here: leave it be
            return logits
        only_end = torch.full_like(logits, float("-inf"))
        only_end[self.stop_ids] = ends
        return only_end


class EndOnRepeatedLine(AdapterLogitsProcessor):
    """vLLM logits processor: ends the requests whose extra_args ask for it (REPEATED_LINE_ARGS) at
    their first repeated line; others pass untouched."""

    def __init__(self, vllm_config, device, is_pin_memory):
        super().__init__(vllm_config, device, is_pin_memory)
        self.model_config = vllm_config.model_config
        self.tokenizer = None

    def is_argmax_invariant(self) -> bool:
        return False

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:  # loaded only once a request asks, as the engine loads it
            from transformers import AutoTokenizer

            c = self.model_config
            self.tokenizer = AutoTokenizer.from_pretrained(c.tokenizer, revision=c.tokenizer_revision,
                                                           trust_remote_code=c.trust_remote_code)
        return self.tokenizer.decode(token_ids, clean_up_tokenization_spaces=False)

    @lru_cache(maxsize=None)  # noqa: B019 (one processor per engine, for the engine's life)
    def piece(self, token_id: int) -> str:
        return self.decode([token_id])

    def new_req_logits_processor(self, params):
        asked = [style for style, arg in REPEATED_LINE_ARGS.items() if (params.extra_args or {}).get(arg)]
        if len(asked) != 1 or not params.all_stop_token_ids:  # not asked, or asked both ways: decoded whole
            return None
        return _Watcher(self.decode, self.piece, sorted(params.all_stop_token_ids), numbered=asked[0] == "numbered")
