"""The channel between the grader and a kernel: data only in both directions, every field checked.

Unit tests of codec.py (what can be sent, what a forged message gets), of reading a kernel's reply,
and of calling a student's function with the reference standing in for an earlier answer.
"""

from __future__ import annotations

import ast
import math
import os
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from cpu_clock import WALL_BACKSTOP

from specdec.grading import codec, session
from specdec.grading.calls import CallFailed, LocalCaller
from specdec.grading.codec import BadMessage, Decoder, Encoder, NotData, Rng, roundtrip
from specdec.grading.session import reply_of

GRADING = Path(__file__).resolve().parents[1] / "specdec" / "grading"

# what a Lab 3 check sends: a response record shaped like SGLang's /generate answer
RESPONSE = {"text": "def f(x):\n    return x", "output_ids": [11, 12, 13],
            "meta_info": {"id": "a1", "prompt_tokens": 9, "completion_tokens": 3, "spec_verify_ct": 2,
                          "e2e_latency": 0.0123, "finish_reason": {"type": "length", "length": 3},
                          "spec_accept_histogram": None, "cached_tokens": 0}}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("value", [
    None, True, 0, -(2**70), 1.5, float("inf"), float("nan"), "naïve ✓", [], (), {},
    [1, (2, 3.0), {"a": [None, False]}], {1: "int key", (1, 2): "tuple key", "s": ()},
    np.arange(12, dtype=np.int32).reshape(3, 4), np.arange(12.0).reshape(3, 4).T, np.zeros((0, 3)),
    np.array(3.5), np.float32(2.5), np.int64(7), np.bool_(True), np.array([True, False]),
    torch.arange(6).reshape(2, 3), torch.ones(2, dtype=torch.float16), torch.tensor([True, False]),
    RESPONSE, [RESPONSE, RESPONSE],
], ids=repr)
def test_data_goes_through_unchanged(value):
    assert same(value, roundtrip(value))


def test_what_torch_sends_as_numpy_comes_back_as_torch():
    t = torch.linspace(0, 1, 5, dtype=torch.bfloat16)
    back = roundtrip(t)
    assert back.dtype == torch.float32 and torch.equal(back, t.float())  # numpy has no bfloat16
    assert not roundtrip(torch.ones(3, requires_grad=True)).requires_grad
    back[0] = 9.0  # a fresh, writable tensor of its own
    assert t[0] == 0


def test_an_rng_is_sent_as_its_seed():
    a, b = roundtrip((Rng(5), Rng(5)))
    assert isinstance(a, np.random.Generator) and a.random() == b.random() == np.random.default_rng(5).random()


def test_a_model_is_built_from_its_seed_only_where_the_grader_sends_it():
    """q8's tiny model travels as (config, seed): the kernel (models=True) builds the grader's weights, without
    touching its global random state; a reply from the kernel may not make the grader build one, nor a big one."""
    from specdec.decoder.model import Transformer
    from specdec.grading.codec import Model, build_model

    m = Model((("vocab_size", 16), ("hidden_size", 8), ("intermediate_size", 16), ("num_hidden_layers", 1),
               ("num_attention_heads", 2), ("num_key_value_heads", 1)), seed=3)
    enc = Encoder()
    tree = enc.encode((m, m))
    state = torch.random.get_rng_state()
    a, b = Decoder(enc.buffers, models=True).decode(tree)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert isinstance(a, Transformer) and a is b  # one model per message: a call's cases share it
    mine = build_model(m)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), mine.state_dict().values()))
    with pytest.raises(BadMessage, match="only data"):
        Decoder(enc.buffers).decode(tree)  # the grader reading a reply
    huge = {"model": [[["vocab_size", 10**9]], 0, 0.5]}
    with pytest.raises(BadMessage, match="malformed model"):
        Decoder([], models=True).decode(huge)



def test_models_built_in_threads_at_once_have_their_seeds_weights():
    """`specdec grade -j N` grades notebooks in threads: two q8 checks building their models at once, while other
    threads draw from torch's global random state, must each get their seed's weights (when they seeded the one
    global state, a right solution once lost all of q8's points in CI: the grader's and the kernel's models differed)."""
    import threading

    from specdec.grading.codec import Model, build_model

    config = (("vocab_size", 64), ("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 2),
              ("num_attention_heads", 4), ("num_key_value_heads", 2))
    want = {seed: build_model(Model(config, seed)).state_dict() for seed in (1, 2)}
    wrong, start = [], threading.Barrier(3)

    def build(seed):
        start.wait()
        for _ in range(20):
            got = build_model(Model(config, seed)).state_dict()
            wrong.extend(seed for k in got if not torch.equal(got[k], want[seed][k]))

    def draw():
        start.wait()
        for _ in range(200):
            torch.randn(1000)

    threads = [threading.Thread(target=build, args=(1,)), threading.Thread(target=build, args=(2,)),
               threading.Thread(target=draw)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} weights drawn from another thread's numbers"


def test_a_kv_cache_travels_as_its_tensors_and_lengths():
    from specdec.decoder.kv_cache import KVCache

    cache = KVCache(2, 3, 1, 4, 8)
    cache.k[1][2, 0, 5] = 7.0
    cache.lengths.copy_(torch.tensor([1, 6, 2]))
    back = roundtrip(cache)
    assert isinstance(back, KVCache) and back.max_len == 8 and back.batch == 3
    assert torch.equal(back.lengths, cache.lengths) and all(torch.equal(x, y) for x, y in zip(back.k, cache.k))
    assert torch.equal(back.positions(2), cache.positions(2))
    cache.k = "gone"  # whatever a student leaves in it comes back as it is, for the judge to name
    assert roundtrip(cache).k == "gone"


class Mean(float):
    def __eq__(self, other):  # the classic: equal to anything
        return True


def cyclic():
    x = []
    x.append(x)
    return x


@pytest.mark.parametrize("value, words", [
    (object(), "object object"),
    (Mean(2.0), "Mean object"),
    ((x for x in [1]), "generator object"),
    (np.array([object()]), "dtype object"),
    (np.array(["a"]), "dtype str"),
    (cyclic(), "nested deeper"),
    (torch.eye(2).to_sparse(), "sparse"),
    (lambda: 1, "function object"),
])
def test_anything_else_is_not_data(value, words):
    with pytest.raises(NotData, match=words):
        Encoder().encode(value)


@pytest.mark.parametrize("tree, buffers", [
    ({"pickle": "gASVAAAAAAAAAAAu"}, []),  # an unknown tag
    ({"tuple": [1], "dict": []}, []),  # two tags
    ({"ndarray": {"dtype": "object", "shape": [1], "buffer": 0}}, [b"\0" * 8]),
    ({"ndarray": {"dtype": "float64", "shape": [2], "buffer": 0}}, [b"\0" * 8]),  # bytes short of the shape
    ({"ndarray": {"dtype": "float64", "shape": [1], "buffer": 3}}, [b"\0" * 8]),  # no such buffer
    ({"ndarray": {"dtype": "float64", "shape": [-1], "buffer": 0}}, [b"\0" * 8]),
    ({"ndarray": {"dtype": "float64", "shape": [2**62, 4], "buffer": 0}}, [b""]),  # 0 bytes if int64 overflowed
    ({"ndarray": {"dtype": "float64", "shape": "8", "buffer": 0}}, [b"\0" * 8]),
    ({"dict": [[[1], 2]]}, []),  # an unhashable key
    ({"rng": "seed"}, []),
    (1j, []),
])
def test_a_forged_message_is_refused(tree, buffers):
    with pytest.raises(BadMessage):
        Decoder(buffers).decode(tree)


def test_a_deep_message_is_refused_not_a_crash():
    tree = 0
    for _ in range(10_000):
        tree = [tree]
    with pytest.raises(BadMessage, match="deep"):
        Decoder([]).decode(tree)
    with pytest.raises(BadMessage):
        codec.unpack_header(b"[" * 100_000 + b"]" * 100_000)


def test_the_reader_bounds_size_and_time():
    r, w = os.pipe()
    try:
        reader = codec.TimedReader(r)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            reader.read(time.monotonic() + 0.2)
        assert time.monotonic() - start < 2
        os.write(w, codec.HEADER.pack(1 << 30))
        with pytest.raises(BadMessage, match="more than"):
            reader.read(time.monotonic() + 1)
        os.write(w, codec.pack({"id": 1}, [b"x" * 100]))
        assert reader.read(time.monotonic() + 1, limit=200) == ({"id": 1, "buffers": [100]}, [b"x" * 100])
        os.write(w, codec.pack({"id": 2}, [b"x" * 100]))
        with pytest.raises(BadMessage, match="arrays of 100 bytes"):  # (the channel is out of step now)
            reader.read(time.monotonic() + 1, limit=50)
    finally:
        os.close(w)
        os.close(r)
    r, w = os.pipe()
    os.write(w, codec.pack({"id": 3})[:-1])
    os.close(w)
    with pytest.raises(EOFError):  # the kernel died halfway through a message
        codec.TimedReader(r).read(time.monotonic() + 1)
    os.close(r)


def reply(**changes) -> dict:
    return {"id": 1, "outcomes": [{"value": 1}], "bound": [], "missing": False, "not_callable": None,
            "stopped": None, "buffers": [], **changes}


@pytest.mark.parametrize("msg", [
    reply(outcomes=[{"value": 1, "raised": ["E", "m"]}]),
    reply(outcomes=[{"raised": "E"}]),
    reply(outcomes=[{"score": 1.0}]),
    reply(outcomes="all right"),
    reply(outcomes=[{"value": {"ndarray": {"dtype": "object", "shape": [], "buffer": 0}}}]),
])
def test_a_malformed_reply_of_a_kernel_is_refused(msg):
    with pytest.raises((BadMessage, TypeError, CallFailed)):
        reply_of(msg, [b"\0" * 8])


def test_a_reply_is_read_as_data():
    got = reply_of(reply(outcomes=[{"value": {"tuple": [1, 2.5]}}, {"raised": ["ValueError", "bad p"]},
                                   {"not_data": "a Foo object"}], bound=["residual", 3]), [])
    assert [o.value for o in got.outcomes] == [(1, 2.5), None, None]
    assert got.outcomes[1].raised_type == "ValueError" and got.outcomes[2].not_data == "a Foo object"
    assert got.bound == ["residual"]


def test_the_grading_process_never_unpickles():
    """Nothing in specdec/grading imports a module that can run code while loading data."""
    unsafe = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
    for path in GRADING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            assert not {n.split(".")[0] for n in names} & unsafe, path
        assert "torch.load" not in path.read_text() and "np.load" not in path.read_text(), path


RESIDUAL_CALLS = []


def residual(p, q):  # a wrong residual of the student's, which q3's check must not use
    RESIDUAL_CALLS.append(1)
    return p


def speculative_step(p_rows, q_rows, draft_tokens, rng):
    return 0, [int(np.argmax(residual(p_rows[0], q_rows[0])))]


def test_the_reference_stands_in_for_an_earlier_answer_and_is_put_back():
    ns = {"speculative_step": speculative_step}
    stand_ins = {"residual": "specdec.sim.verify:residual_distribution"}
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    got = LocalCaller(ns).call("speculative_step", [(p[None], q[None], np.array([0]), Rng(0))], stand_ins)
    assert got.bound == ["residual"] and got.outcomes[0].value == (0, [1])  # the true residual is [0, 1]
    assert not RESIDUAL_CALLS and globals()["residual"] is residual


def test_arguments_are_copies():
    p = np.array([0.5, 0.5])

    def mutate(x):
        x[0] = 9.0
        return float(x.sum())

    assert LocalCaller({"f": mutate}).call("f", [(p,)], {}).outcomes[0].value == 9.5
    assert p[0] == 0.5


@pytest.fixture
def rogue(monkeypatch, tmp_path):
    """Start tests/fixtures/rogue_kernel.py as the kernel, misbehaving as asked."""
    fixtures = str(Path(__file__).parent / "fixtures")
    monkeypatch.setattr(session, "KERNEL_MODULE", "rogue_kernel")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([fixtures, os.environ.get("PYTHONPATH", "")]))
    started = []

    def start(mode: str, seconds: float = 30.0) -> session.Kernel:
        monkeypatch.setenv("SPECDEC_ROGUE", mode)  # SPECDEC_*: passed to the kernel (session.kernel_env)
        started.append(session.Kernel(str(tmp_path), str(tmp_path), 0, session.Budget(seconds)))
        return started[-1]

    yield start
    for k in started:
        k.kill()


@pytest.mark.parametrize("mode, words", [("garbage", "malformed message"), ("future", "answered out of turn")])
def test_a_kernel_that_breaks_the_protocol_is_killed(rogue, mode, words):
    kernel = rogue(mode)
    with pytest.raises(session.KernelGone, match=words):
        kernel.ready()
    assert not kernel.alive and kernel.proc.returncode is not None


def test_a_stale_reply_is_skipped(rogue):
    kernel = rogue("stale").ready()
    assert kernel.run_cell("x = 1", 5) is None  # the stale reply said "error"


def test_a_kernel_that_hangs_is_killed_at_its_limit_plus_grace(rogue):
    kernel = rogue("hang").ready()
    start = time.monotonic()
    with pytest.raises(session.KernelGone, match="did not stop at the time limit of 0.5s"):
        kernel.run_cell("while True: pass", 0.5)
    # killed on the wall clock (the rogue kernel answers nothing), long before its budget (30 s): a bound
    # of WALL_BACKSTOP x (limit + grace), which a loaded machine does not reach
    assert time.monotonic() - start < WALL_BACKSTOP * (0.5 + session.GRACE_S) and not kernel.alive


def test_the_total_time_limit_wins(rogue):
    kernel = rogue("hang", seconds=1.0).ready()
    with pytest.raises(session.OutOfTime):
        kernel.run_cell("while True: pass", 100)


def test_a_kernel_killed_twice_closes_its_descriptors_once():
    """A run that timed out kills its kernel, and closing the run kills it again: the second kill must not close
    descriptor numbers that another grading thread has reused meanwhile (that broke a clean-up in CI)."""

    class Done:  # a process already reaped, an output reader already finished
        returncode, pid, stdout = 0, -1, open(os.devnull, "rb")

        def join(self, timeout=None):
            pass

        def is_alive(self):
            return False

    kernel = object.__new__(session.Kernel)
    kernel.proc, kernel.output = Done(), Done()
    kernel.fds_open = os.pipe()
    kernel.requests, kernel.replies = kernel.fds_open[0], types.SimpleNamespace(fd=kernel.fds_open[1])
    kernel.kill()
    reused = os.pipe()  # the lowest free numbers: those kill() just closed
    try:
        kernel.kill()
        for fd in reused:
            os.fstat(fd)  # still open
    finally:
        for fd in reused:
            os.close(fd)
