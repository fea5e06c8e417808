"""Streaming detokenizes incrementally: the same text as decoding the whole output after every step, at O(n) work."""

import random
from types import SimpleNamespace

import pytest

from specdec.decoder.engine import RowUpdate, SamplingParams
from specdec.serving.server.detokenize import Detokenizer
from specdec.serving.server.scheduler import Prefix, Progress, Request, Scheduler

TEXTS = ["import os\nimport sys\n\ndef main(", "Monday, Tuesday, Wednesday, Thursday",
         "café, naïve, Straße — 日本語のテキスト, emoji 🎉🚀 and ünïcödé\n", "x = 1\nfor i in range(10):\n    x = x * 2 + i\n"]


@pytest.fixture(scope="module", params=["zoo", "hf"])
def tokenizer(request, tiny_bundle):
    """The zoo's own tokenizer and the same files read by transformers' AutoTokenizer."""
    if request.param == "zoo":
        return tiny_bundle.tokenizer
    from specdec.decoder.bundle import load_tokenizer

    return load_tokenizer(tiny_bundle.paths["target"])


def outputs(tokenizer) -> list[list[int]]:
    """Output ids to stream: each text's tokens, the texts run together, and random ids (broken characters,
    special tokens among them)."""
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    rng = random.Random(0)
    return ids + [sum(ids, []), [rng.randrange(len(tokenizer)) for _ in range(300)]]


def steps(ids: list[int], seed: int) -> list[list[int]]:
    """ids cut into the pieces a speculative server keeps per step (1 to 5 tokens)."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(ids[i:i + n])
        i += n
    return out


def test_the_text_shown_after_each_step_is_the_whole_decode_less_a_half_character(tokenizer):
    held = 0
    for j, ids in enumerate(outputs(tokenizer)):
        d, seen = Detokenizer(tokenizer), []
        for piece in steps(ids, j):
            seen += piece
            d.update(seen)
            held += d.pending.endswith("\ufffd")
            whole = tokenizer.decode(seen, skip_special_tokens=True)
            assert d.shown == whole.rstrip("\ufffd")  # what the server showed when it decoded everything each step
            assert whole.startswith(d.text) and d.text + d.pending == whole
    assert held > 0  # some steps ended in half a character (held back)


class Events(list):
    put_nowait = list.append  # the asyncio.Queue a real handle has


class FakeHandle:
    """A caller whose event loop runs what the scheduler hands it at once (the scheduler's _flush)."""

    def __init__(self, request: Request):
        self.request, self.done, self.events = request, False, Events()
        self.loop = SimpleNamespace(call_soon_threadsafe=lambda fn, *args: fn(*args))

    def push(self, event) -> None:
        self.events.append(event)


def serve(tokenizer, ids: list[int], stop=(), seed=0, stream=True) -> list[Progress]:
    """The scheduler's delivery of one request whose row keeps `ids` in steps; its events."""
    engine = SimpleNamespace(retire=lambda slot: None)
    s = Scheduler(engine, tokenizer)
    h = FakeHandle(Request(ids[:1], SamplingParams(max_new_tokens=len(ids), stop_at_eos=False), stop=stop,
                           stream=stream))
    s.rows[0] = (h, Progress())
    pieces = steps(ids, seed)
    for i, piece in enumerate(pieces):
        if 0 not in s.rows:
            break
        last = "length" if i == len(pieces) - 1 else None
        step = RowUpdate(0, piece, len(piece) - 1, 4, last, [0] * 4) if i else RowUpdate(0, piece, -1, 0, last)
        s._deliver(step)
        s._flush()
    return h.events


def streamed(events: list[Progress]) -> str:
    """The deltas an OpenAI stream sends (app.py), joined."""
    sent = ""
    for p in events:
        text = p.text if p.finish_reason is not None else p.text.rstrip("\ufffd")
        sent += text[len(sent):]
    return sent


def test_streamed_and_final_text_equal_the_whole_decode(tokenizer):
    for j, ids in enumerate(outputs(tokenizer)):
        events = serve(tokenizer, ids, seed=j)
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        assert streamed(events) == whole and events[-1].text == whole
        assert list(events[-1].output_ids) == ids and events[-1].finish_reason["type"] == "length"


@pytest.mark.parametrize("stop", [", Wed", "sys\n\nd", "日本", "🚀 a", "x * 2"])
def test_a_stop_string_across_steps_cuts_where_the_whole_decode_cuts(tokenizer, stop):
    """The request ends at the step whose text first holds the stop string, the text cut before it."""
    text = "".join(TEXTS)
    ids = tokenizer(text)["input_ids"]
    for seed in range(6):
        events = serve(tokenizer, ids, stop=(stop, "never here"), seed=seed)
        last = events[-1]
        n = len(last.output_ids)
        whole = tokenizer.decode(ids[:n], skip_special_tokens=True)
        assert last.finish_reason == {"type": "stop", "matched": stop}
        assert last.text == whole[:whole.find(stop)]
        for p in events[:-1]:  # what was streamed before: as today's server showed it
            assert p.text == tokenizer.decode(list(p.output_ids), skip_special_tokens=True).rstrip("\ufffd")
        # the step before had not reached it: today's server (the whole text each step) stopped at the same step
        before = n - len(steps(ids, seed)[len(events) - 1])
        assert stop not in tokenizer.decode(ids[:before], skip_special_tokens=True)
        assert stop in whole


def test_a_request_that_does_not_stream_gets_the_same_final_text(tokenizer):
    ids = outputs(tokenizer)[2]
    (final,) = serve(tokenizer, ids, stream=False)
    assert final.text == tokenizer.decode(ids, skip_special_tokens=True)
    (final,) = serve(tokenizer, ids, stop=("Straße",), stream=False)
    assert final.text == "café, naïve, " and final.finish_reason["matched"] == "Straße"


class Counting:
    """A tokenizer that counts the ids it is asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids = tokenizer, 0

    def decode(self, ids, skip_special_tokens=False):
        self.ids += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_decode_work_grows_linearly_with_the_output(tiny_bundle):
    """2,000 tokens streamed 1 to 5 a step: the ids decoded stay a small multiple of the output (the whole output
    decoded every step was about n^2 / 6, 670,000 ids), and no event copies the growing lists."""
    tok = tiny_bundle.tokenizer
    ids = (tok("".join(TEXTS) * 40)["input_ids"])[:2000]
    assert len(ids) == 2000
    counting = Counting(tok)
    events = serve(counting, ids)
    assert streamed(events) == tok.decode(ids, skip_special_tokens=True)
    steps_taken = len(events)
    streaming_work = counting.ids - len(ids)  # less the one whole decode of the final text
    assert streaming_work < 8 * len(ids), (streaming_work, steps_taken)
    assert all(isinstance(p.output_ids, Prefix) for p in events[:-1])
    assert events[-3].output_ids.items is events[-2].output_ids.items  # one list, read up to each event's length


def test_tokens_without_text_do_not_grow_the_window(tiny_bundle):
    """A random-weight 8B-shaped model served with the zoo's tokenizer writes mostly ids the tokenizer does not know
    (they decode to nothing): the window must still move on."""
    tok = tiny_bundle.tokenizer
    rng = random.Random(1)
    ids = [rng.randrange(128256) for _ in range(2000)]
    counting = Counting(tok)
    events = serve(counting, ids)
    assert streamed(events) == tok.decode(ids, skip_special_tokens=True)
    assert counting.ids - len(ids) < 8 * len(ids)


def test_a_prefix_reads_as_the_list_it_was():
    items = [1, 2, 3]
    p = Prefix(items)
    items += [4, 5]
    assert len(p) == 3 and list(p) == [1, 2, 3] and p == [1, 2, 3] and p[-1] == 3 and p[1:] == [2, 3]
    assert sum(p) == 6 and p.count(2) == 1
    with pytest.raises(IndexError):
        p[3]
