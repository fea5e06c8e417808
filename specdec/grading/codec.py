"""Data-only messages between the grading process and the student's kernel: JSON plus raw arrays.

A message is a 4-byte length, a JSON header, then the raw bytes of the arrays it holds. Values are
None, bools, ints, floats, strings, lists, tuples, dicts, numpy arrays and scalars of numeric
dtypes, torch tensors (sent as numpy; bfloat16 as float32), a KVCache (its tensors and lengths) and,
from the grader only, a seeded numpy Generator (`Rng`) and a tiny random-weight model (`Model`, built
only where the decoder is told it may: the kernel and check()). Nothing is pickled: decoding never runs
code that the bytes choose, whatever they are.
numpy and torch are imported only when a message holds one of theirs, so the grading command
stays light until it grades.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import select
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # nesting of lists/dicts; deeper (or a cycle) is not data
MAX_DIMS = 32  # of an array on the wire; each dimension at most MAX_REPLY_BYTES (no arithmetic on huge ints)
MAX_REPLY_BYTES = 64 << 20  # what the grader reads of one message from the kernel
HEADER = struct.Struct(">I")
# dtypes an array may have on the wire; anything else (object, strings, records) is not data
DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"}


class NotData(Exception):
    """A value that cannot be sent: the message names its type."""


class BadMessage(Exception):
    """Bytes that are not a well-formed message (cut short, too big, or not what was sent)."""


@dataclass(frozen=True)
class Rng:
    """Stands for np.random.default_rng(seed) in the arguments of a call."""

    seed: int


@dataclass(frozen=True)
class Model:
    """Stands for a tiny Transformer with this config (a ModelConfig's fields) and weights drawn from
    seed (normal, std: large enough for peaked, unambiguous argmaxes) in the arguments of a call."""

    config: tuple  # ((field, value), ...): hashable, so the grader builds each model once
    seed: int
    std: float = 0.5


MODEL_FIELDS = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
                "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 512}  # at most


def build_model(m: Model) -> Any:
    """The Transformer a Model stands for: the same weights in every process (same torch), the caller's
    global random state untouched, inference only."""
    model_mod = importlib.import_module("specdec.decoder.model")
    torch = _torch()
    with torch.random.fork_rng(devices=[]):  # the constructor's own init draws from the global state
        model = model_mod.Transformer(model_mod.ModelConfig(**dict(m.config)))
    # every weight from a generator of the model's own: `specdec grade -j N` grades in threads, and two checks
    # seeding torch's one global state at once drew each other's numbers (the grader's model and the kernel's
    # then differed, and a right answer lost all its points)
    model_mod.init_weights(model, m.std, generator=torch.Generator().manual_seed(m.seed))
    return model.eval().requires_grad_(False)


def _np() -> Any:
    return importlib.import_module("numpy")


def _torch() -> Any:
    return importlib.import_module("torch")


def type_name(x: Any) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


class Encoder:
    """Turns a value into a JSON tree; arrays go to `buffers` and the tree holds their index."""

    def __init__(self) -> None:
        self.buffers: list[bytes] = []

    def array(self, a: Any) -> dict[str, Any]:
        if a.dtype.name not in DTYPES:
            raise NotData(f"an array of dtype {a.dtype.name}")
        self.buffers.append(a.tobytes(order="C"))  # any layout; 0-d stays 0-d
        return {"dtype": a.dtype.name, "shape": list(a.shape), "buffer": len(self.buffers) - 1}

    def encode(self, x: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise NotData(f"a structure nested deeper than {MAX_DEPTH} levels (or one that contains itself)")
        t = type(x)
        if x is None or t in (bool, int, float, str):
            return x
        if t is list:
            return [self.encode(v, depth + 1) for v in x]
        if t is tuple:
            return {"tuple": [self.encode(v, depth + 1) for v in x]}
        if t is dict:
            return {"dict": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in x.items()]}
        if t is Rng:
            return {"rng": int(x.seed)}
        if t is Model:
            return {"model": [[[str(k), int(v)] for k, v in x.config], int(x.seed), float(x.std)]}
        kv = sys.modules.get("specdec.decoder.kv_cache")  # a KVCache can exist only if its module was imported
        if kv is not None and t is kv.KVCache:  # its state, as data: what a student's step left in it
            return {"kvcache": [self.encode(x.k, depth + 1), self.encode(x.v, depth + 1),
                                self.encode(x.lengths, depth + 1), self.encode(x.max_len, depth + 1)]}
        np = sys.modules.get("numpy")  # a numpy array can exist only if numpy was imported
        if np is not None and isinstance(x, np.ndarray):
            return {"ndarray": self.array(np.asarray(x))}
        if np is not None and isinstance(x, np.generic):
            return {"scalar": self.array(np.asarray(x))}
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            if x.layout != torch.strided:
                raise NotData(f"a {x.layout} tensor (send a dense one)")
            t_ = x.detach().cpu().resolve_conj().resolve_neg()
            if t_.dtype == torch.bfloat16:
                t_ = t_.float()
            return {"tensor": self.array(t_.numpy())}
        raise NotData(f"a {type_name(x)} object")


class Decoder:
    """The inverse of Encoder, on bytes that may have been forged: every field is checked."""

    def __init__(self, buffers: list[bytes], models: bool = False):
        self.buffers = buffers
        self.models = models  # may build a Model: only where the grader's arguments are read (never its replies)
        self.built: dict[Model, Any] = {}  # one model per message: a call's cases share it

    def array(self, spec: Any) -> Any:
        if not (isinstance(spec, dict) and set(spec) == {"dtype", "shape", "buffer"}):
            raise BadMessage("a malformed array")
        dtype, shape, index = spec["dtype"], spec["shape"], spec["buffer"]
        if dtype not in DTYPES or type(index) is not int or not 0 <= index < len(self.buffers):
            raise BadMessage("an array with a bad dtype or buffer")
        # bounded before any arithmetic: a product of a thousand 4,000-digit dimensions takes minutes
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
                and all(type(n) is int and 0 <= n <= MAX_REPLY_BYTES for n in shape)):
            raise BadMessage("an array with a bad shape")
        np = _np()
        raw = self.buffers[index]
        if math.prod(shape) * np.dtype(dtype).itemsize != len(raw):  # exact: no int64 overflow
            raise BadMessage("an array whose bytes do not match its shape")
        try:
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        except ValueError:  # an empty array whose other dimensions numpy cannot index
            raise BadMessage("an array with a bad shape") from None

    def decode(self, tree: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise BadMessage("nested too deep")
        t = type(tree)
        if tree is None or t in (bool, int, float, str):
            return tree
        if t is list:
            return [self.decode(v, depth + 1) for v in tree]
        if t is not dict or len(tree) != 1:
            raise BadMessage(f"an unexpected {t.__name__}")
        (tag, body), = tree.items()
        if tag == "tuple" and type(body) is list:
            return tuple(self.decode(v, depth + 1) for v in body)
        if tag == "dict" and type(body) is list and all(type(kv) is list and len(kv) == 2 for kv in body):
            out = {}
            for k, v in body:
                key = self.decode(k, depth + 1)
                try:
                    out[key] = self.decode(v, depth + 1)
                except TypeError:  # a list as a key
                    raise BadMessage("an unhashable dict key") from None
            return out
        if tag == "ndarray":
            return self.array(body)
        if tag == "scalar":
            return self.array(body)[()]
        if tag == "tensor":
            return _torch().from_numpy(self.array(body))
        if tag == "rng" and type(body) is int:
            return _np().random.default_rng(body)
        if tag == "model":
            if not self.models:  # a kernel's reply cannot make the grader build anything
                raise BadMessage("a model where only data may come")
            m = self.model(body)
            if m not in self.built:
                self.built[m] = build_model(m)
            return self.built[m]
        if tag == "kvcache" and type(body) is list and len(body) == 4:
            return self.kvcache([self.decode(v, depth + 1) for v in body])
        raise BadMessage(f"an unknown tag {tag!r}")

    @staticmethod
    def model(body: Any) -> Model:
        """A Model's fields, bounded: even the grader's arguments build nothing big."""
        ok = (type(body) is list and len(body) == 3 and type(body[0]) is list and type(body[1]) is int
              and type(body[2]) is float and 0 < body[2] < 10
              and all(type(kv) is list and len(kv) == 2 and kv[0] in MODEL_FIELDS and type(kv[1]) is int
                      and 0 < kv[1] <= MODEL_FIELDS[kv[0]] for kv in body[0]))
        if not ok:
            raise BadMessage("a malformed model")
        return Model(tuple((k, v) for k, v in body[0]), body[1], body[2])

    @staticmethod
    def kvcache(parts: list[Any]) -> Any:
        """A KVCache holding what was sent, as sent: its judge checks shapes and values (and says what is wrong)."""
        cache = object.__new__(importlib.import_module("specdec.decoder.kv_cache").KVCache)
        cache.k, cache.v, cache.lengths, cache.max_len = parts
        try:
            cache.batch = len(cache.lengths)
        except TypeError:  # not a vector: the judge says so
            cache.batch = None
        cache.span = cache.slots = cache.visible = None  # a chain's cache: no tree view (kv_cache.tree)
        return cache


def pack(header: dict[str, Any], buffers: list[bytes] = ()) -> bytes:
    """One message: the header (JSON) names the sizes of the raw buffers that follow it."""
    head = json.dumps({**header, "buffers": [len(b) for b in buffers]}).encode("utf-8")
    return b"".join([HEADER.pack(len(head)), head, *buffers])


def unpack_header(head: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(head.decode("utf-8"))
    except (ValueError, RecursionError):
        raise BadMessage("a header that is not JSON") from None
    sizes = msg.get("buffers") if isinstance(msg, dict) else None
    if not (isinstance(sizes, list) and all(type(n) is int and n >= 0 for n in sizes)):
        raise BadMessage("a header without its buffer sizes")
    return msg


def write_message(fd: int, header: dict[str, Any], buffers: list[bytes] = ()) -> None:
    data = memoryview(pack(header, buffers))
    while data:
        data = data[os.write(fd, data):]


def _read_blocking(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_message(fd: int) -> tuple[dict[str, Any], list[bytes]]:
    """Blocking read of one message (the kernel's side: it trusts the grader)."""
    (n,) = HEADER.unpack(_read_blocking(fd, HEADER.size))
    msg = unpack_header(_read_blocking(fd, n))
    return msg, [_read_blocking(fd, size) for size in msg["buffers"]]


class TimedReader:
    """The grader's side: reads messages from a non-blocking fd, each by a deadline, each bounded."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)

    def read_exact(self, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, min(n - got, 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise EOFError("the kernel closed the channel")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def read(self, deadline: float, limit: int = MAX_REPLY_BYTES) -> tuple[dict[str, Any], list[bytes]]:
        """One message; TimeoutError at the deadline, EOFError if the kernel is gone, BadMessage."""
        (n,) = HEADER.unpack(self.read_exact(HEADER.size, deadline))
        if n > limit:
            raise BadMessage(f"a message of {n} bytes (more than {limit})")
        msg = unpack_header(self.read_exact(n, deadline))
        if n + sum(msg["buffers"]) > limit:
            raise BadMessage(f"arrays of {sum(msg['buffers'])} bytes (more than {limit})")
        return msg, [self.read_exact(size, deadline) for size in msg["buffers"]]


def roundtrip(value: Any) -> Any:
    """What the other side would see: a deep copy made of data only (raises NotData)."""
    enc = Encoder()
    tree = enc.encode(value)
    return Decoder(enc.buffers).decode(tree)
