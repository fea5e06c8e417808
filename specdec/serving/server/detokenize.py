"""Incremental detokenizing: a streamed request's text grows by decoding only the tail of its output.

Decoding the whole output after every step costs O(n) a step, O(n^2) a request. As SGLang's and vLLM's
detokenizers do, keep two offsets into the output ids: tokens before `read_offset` are in `text`; the
window from `prefix_offset` (a few tokens of context, so that a token's leading space or a multi-byte
character is decoded as in the whole text) is decoded twice, without and with the new tokens, and the
difference is what they add. A window whose text ends in U+FFFD (half a UTF-8 character: the rest comes
with the next token) is held back in `pending` and decoded again with the next step's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

HALF_CHARACTER = "\ufffd"  # what a decoder gives for the first bytes of a character whose last ones are to come


@dataclass
class Detokenizer:
    tokenizer: object
    text: str = ""  # the text of ids[:read_offset], settled: later tokens never change it
    pending: str = ""  # what ids[read_offset:] add so far (may end in half a character)
    prefix_offset: int = 0  # the window decoded again starts here
    read_offset: int = 0  # tokens before it are in `text`
    searched: int = 0  # `find` has looked for stop strings ending before this point of `text`

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)  # SGLang's default

    def update(self, ids: list[int]) -> str:
        """Read the output ids so far (the same list, grown since the last call); returns the settled delta."""
        if len(ids) <= self.read_offset:
            return ""
        before = self.decode(ids[self.prefix_offset:self.read_offset]) if self.read_offset > self.prefix_offset else ""
        after = self.decode(ids[self.prefix_offset:])
        self.pending = after[len(before):]
        # settled: new text that ends in a whole character; or no new text at all (special tokens, or ids the
        # tokenizer does not know, as a random-weight model writes), which would otherwise keep the window growing
        grew = len(after) > len(before) or after == before
        if not grew or after.endswith(HALF_CHARACTER):
            return ""
        delta, self.pending = self.pending, ""
        self.text += delta
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return delta

    @property
    def shown(self) -> str:
        """The text to show now: the settled text and what is pending, less a trailing half character."""
        return self.text + self.pending.rstrip(HALF_CHARACTER) if self.pending else self.text

    def find(self, stops: tuple[str, ...]) -> tuple[int, str] | None:
        """The first stop string in text + pending: (where, which), the earliest (then the smallest string);
        the settled text already searched is not searched again."""
        whole = self.text + self.pending
        hits = [(at, s) for s in stops if s and (at := whole.find(s, max(0, self.searched - len(s) + 1))) >= 0]
        self.searched = len(self.text)
        return min(hits) if hits else None
