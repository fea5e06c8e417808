"""What the HTTP process and the engine process say to each other over their pipe (two Connections).

HTTP -> engine, tuples: ("submit", key, Request), ("cancel", key), ("call", call_id, "state" | "flush"), ("stop",).
Engine -> HTTP, tuples: ("ready", EngineFacts, tokenizer) or ("load_error", usage, message) once at start; then
("events", [(key, Delta | Exception), ...]) once per step, ("reply", call_id, value), ("died", message).

A step's events go as one message, and each request's as a Delta (what is new since its last event), so that
a long output costs the same to send at its 1000th token as at its first.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple

from specdec.decoder.params import SamplingParams, check_prompt


@dataclass
class EngineFacts:
    """The engine's facts that the HTTP side reads (protocol.py's checks, /server_info), gathered once in the
    engine process. Named as the Engine names them, so protocol.py takes this in place of an Engine."""

    max_len: int
    k: int
    block: int  # cache slots a verify step writes past the committed ones
    capacity: int  # rows of the running batch
    vocab_size: int
    speculative: bool
    memory: dict  # engine_process.memory_usage(engine), measured once after the warm-up
    description: str  # engine_process.describe(engine): the first line the CLI prints
    threads: int  # the engine process's torch CPU threads
    model_path: str = ""
    name: str = ""  # what the CLI's first line calls the model
    device: str = ""  # what --device and --dtype came to (their defaults need torch: decided in the engine process)
    dtype: str = ""

    @property
    def proposer(self) -> object | None:
        """Not the proposer itself (it lives in the engine process): only whether there is one."""
        return "remote" if self.speculative else None

    @property
    def target(self) -> SimpleNamespace:
        """What protocol.py reads of the target: its vocabulary size."""
        return SimpleNamespace(config=SimpleNamespace(vocab_size=self.vocab_size))

    def check_prompt(self, prompt: list[int], params: SamplingParams) -> None:
        """Engine.check_prompt's rule, here, so that a request that cannot fit gets its 400 before it is sent."""
        check_prompt(prompt, params, self.vocab_size, self.max_len, self.block if self.speculative else 1)


class Delta(NamedTuple):
    """One request's progress since its previous event. The lists carry only their new items; the text is
    `text[:cut] + tail` (the settled text never changes, so `cut` is where the last event's settled text ended;
    a final event sends its whole text: cut 0). Counters and times are sent whole (they are numbers)."""

    ids: list[int]
    accepted: list[int]
    trace: list[dict]
    cut: int
    tail: str
    verify_ct: int
    drafted: int
    plain_tokens: int
    first_token_at: float | None
    admitted_at: float | None
    finished_at: float | None
    finish_reason: dict | None
