"""Launch configurations: SGLang's rules for each speculative algorithm, checked before anything starts,
and the command line that starts the server (SGLang of a given version, or `specdec serve`).

The same LaunchConfig renders either backend, so a notebook cell reads the same on a laptop
(`specdec serve`) and on a GPU node (SGLang). Facts by version: shared/SGLANG.md.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.decoder.methods import METHODS, SPELLINGS
from specdec.serving.ops.gpu import MIN_KV_TOKENS, read_config, server_needs, size

ALGORITHMS = ("none", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "HEADS")
# Lower-case spellings a student may use (the course's names and specdec serve's) -> SGLang's; EAGLE3 is SGLang's only.
ALIASES = {**{spelling: METHODS[name].sglang for spelling, name in SPELLINGS.items()}, "eagle3": "EAGLE3"}
# SGLang's name -> specdec serve's --speculative-algorithm
SPECDEC_NAMES = {m.sglang: "none" if m.sglang == "none" else m.name for m in METHODS.values()}
NEEDS_DRAFT = {"EAGLE", "EAGLE3", "STANDALONE"}
# Chain/tree drafters that take the three numbers (num_steps, topk, num_draft_tokens).
TREE_DRAFTERS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "HEADS"}
SPEC_ATTENTION_BACKENDS = ("flashinfer", "fa3", "triton", "trtllm_mha")
BACKENDS = ("auto", "sglang", "specdec")
# The version the course's GPU node runs (the offline pack): used when none is installed or given.
DEFAULT_SGLANG_VERSION = "0.5.16"
OLDEST_SGLANG = (0, 5, 5)
# The default KV pool (kv_pool_default): running requests x tokens each. SGLang drops to 48 running
# requests with speculation; a request of the course's prompts and outputs stays well under 4096 tokens.
DEFAULT_ROWS = 48
DEFAULT_CONTEXT = 4096
MEMORY_FLAGS = ("--mem-fraction-static", "--max-total-tokens")  # the user's own sizing: no default then


class LaunchConfigError(ValueError):
    """An invalid launch configuration: one line that names the rule."""


def parse_version(version: str) -> tuple[int, int, int]:
    """'0.5.16', '0.5.16.post1', 'v0.5.10rc0' -> (0, 5, 16)."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if not m:
        raise LaunchConfigError(f"not an SGLang version: {version!r}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def detect_backend() -> str:
    """'sglang' where SGLang is installed and an NVIDIA device is present, else 'specdec'."""
    has_gpu = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")
    return "sglang" if has_gpu and importlib.util.find_spec("sglang") is not None else "specdec"


@dataclass(frozen=True)
class LaunchConfig:
    """One server: a target model, a speculative algorithm, and where and how to serve it.

    `model` and `draft` are directories (or hub ids): zoo names are resolved by the caller
    (`specdec launch` does it), except that `specdec serve` accepts `tiny` itself.
    """

    model: str
    algorithm: str = "none"
    draft: str | None = None  # --speculative-draft-model-path (EAGLE, EAGLE3, STANDALONE)
    num_steps: int | None = None  # draft depth
    topk: int | None = None  # branching per step; 1 = a chain
    num_draft_tokens: int | None = None  # verify width (tokens checked per verify, including the root)
    backend: str = "auto"  # sglang, specdec, or auto (detect_backend)
    host: str = "127.0.0.1"
    port: int | None = None  # None: the launcher picks a free port
    api_key: str | None = None
    max_running_requests: int | None = None  # SGLang drops to 48 with speculation when unset
    tp: int = 1
    dp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # host:port of node 0, needed when nnodes > 1
    attention_backend: str | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None  # SGLang's KV pool in tokens; unset (and no fraction): kv_pool_default()
    context_length: int | None = None  # longest request (prompt + output), both backends; unset: the model's
    enable_metrics: bool = True
    disable_radix_cache: bool = False
    load_format: str | None = None  # "dummy": random weights from config.json alone (target and draft)
    ngram_max_depth: int | None = None  # NGRAM: longest suffix matched (trie depth; match window before 0.5.10)
    rejection_sampling: bool = False  # classic p/q verify at temperature > 0 (0.5.14+, topk 1)
    extra_args: tuple[str, ...] = ()  # passed through unchecked, last, to whichever server the backend starts

    def __post_init__(self):
        algo = ALIASES.get(str(self.algorithm).lower(), str(self.algorithm).upper())
        if algo not in ALGORITHMS:
            _fail(f"unknown speculative algorithm {self.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        object.__setattr__(self, "algorithm", algo)
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        self.validate()

    # ----- rules that hold for every version and backend
    def validate(self) -> None:
        a = self.algorithm
        fail = _fail  # short name: the rules below read as a list
        if not self.model:
            fail("model is empty: give a model directory or hub id")
        if self.backend not in BACKENDS:
            fail(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        numbers = {"num_steps": self.num_steps, "topk": self.topk, "num_draft_tokens": self.num_draft_tokens}
        for name, v in numbers.items():
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                fail(f"{name} must be an integer, got {v!r}")
        if a == "none":
            settings = {**numbers, "draft": self.draft, "ngram_max_depth": self.ngram_max_depth,
                        "rejection_sampling": self.rejection_sampling or None}
            given = [n for n, v in settings.items() if v is not None]
            if given:
                fail(f"algorithm none (plain decoding) takes no speculative settings, got {', '.join(given)}")
        if a in NEEDS_DRAFT and not self.draft:
            fail(f"{a} needs a draft model: set draft (--speculative-draft-model-path)")
        if a == "NEXTN" and self.draft:
            fail("NEXTN uses the target's own MTP layers: leave draft unset")
        if a in ("NGRAM", "HEADS") and self.draft:
            fail(f"{a} takes no draft model: leave draft unset")
        if a in TREE_DRAFTERS:
            given = [v is not None for v in numbers.values()]
            if any(given) and not all(given):
                fail("num_steps, topk and num_draft_tokens are set together or not at all "
                     f"(got {', '.join(f'{n}={v}' for n, v in numbers.items())})")
            if all(given):
                if self.num_steps < 1 or self.topk < 1:
                    fail(f"num_steps and topk must be >= 1, got num_steps={self.num_steps}, topk={self.topk}")
                if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
                    fail(f"topk 1 forces num_draft_tokens = num_steps + 1 = {self.num_steps + 1}, "
                         f"got {self.num_draft_tokens}")
                if not 2 <= self.num_draft_tokens <= self.topk * self.num_steps + 1:
                    fail(f"num_draft_tokens must be in [2, topk * num_steps + 1] = [2, {self.topk * self.num_steps + 1}],"
                         f" got {self.num_draft_tokens}")
        if a == "NGRAM":
            if self.num_steps is not None or self.topk is not None:
                fail("NGRAM sets its own num_steps and topk: give num_draft_tokens only")
            if self.num_draft_tokens is not None and self.num_draft_tokens < 2:
                fail(f"num_draft_tokens must be >= 2, got {self.num_draft_tokens}")
        if self.ngram_max_depth is not None and (a != "NGRAM" or self.ngram_max_depth < 1):
            fail("ngram_max_depth is NGRAM's (>= 1)")
        if self.rejection_sampling:
            if a not in ("EAGLE", "EAGLE3", "NEXTN"):
                fail(f"rejection_sampling is supported for EAGLE, EAGLE3 and NEXTN only, not {a}")
            if self.topk not in (None, 1):
                fail(f"rejection_sampling needs topk 1 (a chain), got topk {self.topk}")
        if self.speculative and self.attention_backend:
            if self.attention_backend not in SPEC_ATTENTION_BACKENDS:
                fail(f"attention backend {self.attention_backend!r} cannot verify drafts; "
                     f"use one of {', '.join(SPEC_ATTENTION_BACKENDS)}")
            if self.attention_backend == "trtllm_mha" and (self.topk or 1) > 1:
                fail("trtllm_mha verifies chains only: topk must be 1")
        if self.port is not None and not 1 <= self.port <= 65535:
            fail(f"port must be in 1..65535, got {self.port}")
        if not self.host:
            fail("host is empty")
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            fail("api_key must be a non-empty string without spaces")
        for name in ("tp", "dp", "nnodes"):
            if getattr(self, name) < 1:
                fail(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.node_rank < self.nnodes:
            fail(f"node_rank must be in [0, nnodes) = [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            fail("several nodes need dist_init_addr (host:port of node 0)")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            fail(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            fail(f"cuda_graph_max_bs must be >= 1, got {self.cuda_graph_max_bs}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            fail(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        for name in ("max_total_tokens", "context_length"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                fail(f"{name} must be an integer >= 1, got {v!r}")

    @property
    def speculative(self) -> bool:
        return self.algorithm != "none"

    def replace(self, **changes) -> LaunchConfig:
        return dataclasses.replace(self, **changes)

    def resolved_backend(self) -> str:
        return detect_backend() if self.backend == "auto" else self.backend

    def sized_by_fraction(self) -> bool:
        """An SGLang server whose KV cache is a fraction of the memory it finds free when it starts
        (mem_fraction_static, or --mem-fraction-static among extra_args): it cannot start beside another server
        that is allocating on the same GPU (serving/ops/gpu.py), so room.lab_servers starts such servers one after
        the other. Without a fraction, the course's default caps each cache in tokens (kv_pool_default)."""
        return self.resolved_backend() == "sglang" and (
            self.mem_fraction_static is not None or _has_flag(self.extra_args, "--mem-fraction-static"))

    def environment(self) -> dict[str, str]:
        """What this server's environment adds: SGLang times its decode steps (/server_info's step_time_dict, which
        Lab 3's step costs and crossover read; off by default in SGLang). specdec serve always times them."""
        return {"SGLANG_RECORD_STEP_TIME": "1"} if self.resolved_backend() == "sglang" else {}

    def command(self, version: str | None = None, python: str = sys.executable) -> list[str]:
        """The argv that starts this server with its backend (SGLang: the installed or given version)."""
        if self.resolved_backend() == "sglang":
            return self.sglang_command(version, python)
        return self.specdec_command(python)

    # ----- SGLang
    def sglang_command(self, version: str | None = None, python: str = sys.executable) -> list[str]:
        """`python -m sglang.launch_server ...` for SGLang `version` (default: installed, else 0.5.16)."""
        v = parse_version(version or installed_sglang_version() or DEFAULT_SGLANG_VERSION)
        shown = ".".join(map(str, v))
        if v < OLDEST_SGLANG:
            _fail(f"SGLang {shown} is older than the oldest this course knows ({'.'.join(map(str, OLDEST_SGLANG))})")
        a = self.algorithm
        if a == "HEADS":
            _fail("SGLang does not serve parallel MTP heads (Medusa); use backend specdec, or EAGLE/NEXTN")
        if self.rejection_sampling and v < (0, 5, 14):
            _fail(f"rejection_sampling needs SGLang 0.5.14 or newer, this is {shown}")
        cmd = [python, "-m", "sglang.launch_server", "--model-path", self.model, "--host", self.host]
        if self.port is not None:
            cmd += ["--port", str(self.port)]
        if a != "none":
            cmd += ["--speculative-algorithm", a]
        if self.draft:
            cmd += ["--speculative-draft-model-path", self.draft]
        for flag, value in (("--speculative-num-steps", self.num_steps), ("--speculative-eagle-topk", self.topk),
                            ("--speculative-num-draft-tokens", self.num_draft_tokens)):
            if value is not None:
                cmd += [flag, str(value)]
        if self.ngram_max_depth is not None:
            # 0.5.10 replaced the match-window flags by a trie of bounded depth.
            flag = "--speculative-ngram-max-trie-depth" if v >= (0, 5, 10) else "--speculative-ngram-max-match-window-size"
            cmd += [flag, str(self.ngram_max_depth)]
        if self.rejection_sampling:
            cmd += ["--speculative-use-rejection-sampling"]
        if self.load_format:
            cmd += ["--load-format", self.load_format]
            if self.draft:
                cmd += ["--speculative-draft-load-format", self.load_format]
        if self.tp > 1:
            cmd += ["--tp-size", str(self.tp)]
        if self.dp > 1:
            cmd += ["--dp-size", str(self.dp)]
        if self.nnodes > 1:
            cmd += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                    "--dist-init-addr", self.dist_init_addr]
        if self.attention_backend:
            cmd += ["--attention-backend", self.attention_backend]
        if self.cuda_graph_max_bs is not None:
            # 0.5.16 renamed it (the old spelling is an alias there, an error from 0.5.20).
            flag = "--cuda-graph-max-bs-decode" if v >= (0, 5, 16) else "--cuda-graph-max-bs"
            cmd += [flag, str(self.cuda_graph_max_bs)]
        if self.disable_cuda_graph:
            cmd += ["--disable-cuda-graph"]
        if self.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(self.mem_fraction_static)]
        if self.context_length is not None:
            cmd += ["--context-length", str(self.context_length)]
        pool = self.kv_pool_default()
        tokens = self.max_total_tokens if self.max_total_tokens is not None else pool.tokens if pool else None
        if tokens is not None:
            cmd += ["--max-total-tokens", str(tokens)]
        if self.max_running_requests is not None:
            cmd += ["--max-running-requests", str(self.max_running_requests)]
        if self.disable_radix_cache:
            cmd += ["--disable-radix-cache"]
        if self.enable_metrics:
            cmd += ["--enable-metrics"]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        return cmd + list(self.extra_args)

    # ----- specdec serve
    def specdec_command(self, python: str = sys.executable) -> list[str]:
        """`python -m specdec serve ...`: the course's own server; GPU-only settings are ignored."""
        a = self.algorithm
        if a == "EAGLE3":
            _fail("specdec serve has no EAGLE3 head; use EAGLE")
        tree = (self.topk or 1) > 1
        if tree and a not in ("EAGLE", "NEXTN", "HEADS"):
            _fail(f"specdec serve drafts a tree (topk {self.topk}) with EAGLE, NEXTN or HEADS only, not {a}")
        if self.tp > 1 or self.dp > 1 or self.nnodes > 1:
            _fail("specdec serve runs one engine on one device: tp, dp and nnodes must be 1")
        cmd = [python, "-m", "specdec", "serve", "--model", self.model, "--speculative-algorithm", SPECDEC_NAMES[a]]
        if self.draft:
            cmd += ["--speculative-draft-model-path", self.draft]
        if tree:  # the tree's depth, branching and verify width, as SGLang's three numbers
            cmd += ["--k", str(self.num_steps), "--topk", str(self.topk)]
            cmd += ["--num-draft-tokens", str(self.num_draft_tokens)] if self.num_draft_tokens is not None else []
        elif self.num_draft_tokens is not None:
            cmd += ["--k", str(self.num_draft_tokens - 1)]  # drafts per verify: the chain without its root
        cmd += ["--host", self.host]
        if self.port is not None:
            cmd += ["--port", str(self.port)]
        if self.max_running_requests is not None:
            cmd += ["--max-running-requests", str(self.max_running_requests)]
        if self.context_length is not None:
            cmd += ["--context-length", str(self.context_length)]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        return cmd + list(self.extra_args)  # e.g. --compile on: `specdec serve`'s own flags, unchecked, last

    # ----- SGLang's KV pool when the user sized nothing
    def kv_pool_default(self) -> KvPool | None:
        """The --max-total-tokens a default SGLang command gets; None where the user sized memory.

        SGLang 0.5.16 gives its KV pool what is free after the weights, less (1 - mem_fraction_static)
        of what was free at start, and the draft worker then allocates a pool of as many tokens beside
        it. For NEXTN the target's share does not count the draft's layers, so the draft's pool does
        not fit (issue 18: 126 GB for the tiny target, then OOM). A pool capped at what the requests
        can hold (running requests x tokens each) keeps both pools small, whatever the GPU.
        """
        extra = self.extra_args
        if self.mem_fraction_static is not None or self.max_total_tokens is not None or any(
                _has_flag(extra, f) for f in MEMORY_FLAGS):
            return None
        config = read_config(self.model) if Path(self.model).is_dir() else {}
        rows = self.max_running_requests or DEFAULT_ROWS
        context, source = self.context_length or _flag_value(extra, "--context-length"), "--context-length"
        if context is None:
            model_max = config.get("max_position_embeddings")
            context, source = DEFAULT_CONTEXT, "the course's default"
            if isinstance(model_max, int) and 0 < model_max < DEFAULT_CONTEXT:
                context, source = model_max, "the model's max_position_embeddings"
        try:
            draft = self.draft if self.draft and Path(self.draft).is_dir() else None
            needs = server_needs(self.model, self.algorithm, draft) if config else None
        except (KeyError, TypeError, ValueError):  # a config.json of another shape: no estimate
            needs = None
        return KvPool(max(rows * context, MIN_KV_TOKENS), rows, context, source,
                      needs.kv_bytes_per_token if needs else 0, needs.weights_bytes if needs else 0,
                      self.algorithm in NEEDS_DRAFT or self.algorithm == "NEXTN")


@dataclass(frozen=True)
class KvPool:
    """The KV pool a default SGLang command asks for (--max-total-tokens), and what it costs."""

    tokens: int
    rows: int  # running requests it holds at full length
    context: int  # tokens per request
    context_from: str
    kv_bytes_per_token: int  # target and draft caches together; 0 without a local config.json
    weights_bytes: int
    draft_cache: bool = False  # a draft model or MTP layer keeps a KV pool of as many tokens beside the target's

    def describe(self) -> str:
        at_least = f", raised to the {MIN_KV_TOKENS} tokens of one prefill" if self.tokens > self.rows * self.context else ""
        text = (f"KV pool: --max-total-tokens {self.tokens} = {self.rows} running requests x {self.context} tokens "
                f"({self.context_from}{at_least})")
        if self.kv_bytes_per_token:
            caches = "target and draft caches" if self.draft_cache else "the target's cache"
            text += (f"; {self.kv_bytes_per_token} B per token ({caches}) = "
                     f"{size(self.tokens * self.kv_bytes_per_token)} beside {size(self.weights_bytes)} of weights")
        return (text + ". Uncapped, SGLang fills the GPU with the target's pool, and neither the draft's pool nor "
                "a second server finds room; give --max-total-tokens or --mem-fraction-static to size it yourself")


def _has_flag(args: tuple[str, ...], flag: str) -> bool:
    """`flag` among pass-through arguments, as `flag V` or `flag=V`."""
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _flag_value(args: tuple[str, ...], flag: str) -> int | None:
    """The integer after `flag` (or in `flag=N`) among pass-through arguments."""
    for i, a in enumerate(args):
        value = args[i + 1] if a == flag and i + 1 < len(args) else a.partition("=")[2] if a.startswith(flag + "=") else None
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _fail(message: str):
    raise LaunchConfigError(message)
