"""What a server's answers mean: one request's record (tokens, latencies, speculative counters),
acceptance per request and across requests, /server_info, and Prometheus /metrics.

Pure functions of the JSON an SGLang server (0.5.10 .. 0.5.23) or `specdec serve` sends, so that
each computation is tested on recorded responses. Tokens are the server's counts, never words.

Vocabulary: tau is tokens per verify step (accepted drafts + 1), as in Labs 1 and 2. SGLang's "accept
length" (spec_accept_length, avg_spec_accept_length) is our tau, counted its way: completion_tokens /
spec_verify_ct, the prefill's first token included. Its field names are kept as SGLang spells them.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from specdec.sim import stats
from specdec.sim.formulas import tau_from_positions

# Per-request speculative counters, newest name first: 0.5.12+ / the 0.5.12-0.5.22 aliases / 0.5.10.
CORRECT_DRAFTS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
PROPOSED_DRAFTS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
KINDS = ("generate", "completions", "chat")


def _first(d: dict, names: tuple[str, ...]):
    return next((d[n] for n in names if d.get(n) is not None), None)


# ----- acceptance
def tau(completion_tokens: int, verify_ct: int) -> float:
    """Tokens per verify step: (completion_tokens - 1) / spec_verify_ct (the first token came from prefill)."""
    if verify_ct <= 0:
        raise ValueError(f"spec_verify_ct must be > 0, got {verify_ct}")
    return (completion_tokens - 1) / verify_ct


def pooled_tau(parts: Iterable[tuple[int, int, int]]) -> float | None:
    """Tokens per verify step across requests, weighted by tokens (not the mean of per-request values):
    parts are (completion_tokens, requests, spec_verify_ct), one per request or per run of requests;
    sum(completion_tokens - requests) / sum(spec_verify_ct). Parts without verify steps are left out;
    None if none has any."""
    tokens = verify = 0
    for completion_tokens, requests, verify_ct in parts:
        if verify_ct:
            tokens += completion_tokens - requests  # each request's first token came from its prefill
            verify += verify_ct
    return tokens / verify if verify else None


def accept_length_sglang(completion_tokens: int, verify_ct: int) -> float:
    """SGLang's spec_accept_length: completion_tokens / spec_verify_ct (counts the prefill token too)."""
    if verify_ct <= 0:
        raise ValueError(f"spec_verify_ct must be > 0, got {verify_ct}")
    return completion_tokens / verify_ct


def acceptance_by_position(histogram: list[int]) -> list[float]:
    """For a chain draft (topk 1): the fraction of verify steps whose draft at position j (1-based) was accepted.

    histogram[i] counts verify steps that accepted exactly i drafts; accepting position j means
    accepting 1..j, so P(j accepted) = sum(histogram[j:]) / sum(histogram). The server counts steps
    where Lab 1 logs each step's accepted drafts: the histogram is unrolled into that log and handed to
    Lab 1's sim.stats.acceptance_by_position, the one implementation.
    """
    total = sum(histogram)
    if total <= 0 or any(h < 0 for h in histogram):
        raise ValueError(f"not a histogram of accepted drafts: {histogram}")
    k = len(histogram) - 1
    if k < 1:
        return []
    accepted = np.repeat(np.arange(k + 1), np.asarray(histogram, dtype=np.int64))
    return stats.acceptance_by_position(accepted, k).tolist()


def conditional_acceptance_by_position(histogram: list[int]) -> list[float]:
    """P(position j accepted | position j-1 accepted): Lab 1's alpha per position (nan where none reached j-1)."""
    reach = [1.0] + acceptance_by_position(histogram)
    return [reach[j] / reach[j - 1] if reach[j - 1] > 0 else math.nan for j in range(1, len(reach))]


def tau_at_k(histogram: list[int], new_k: int) -> float:
    """Tokens per verify step predicted for a chain of new_k drafts from a server's histogram at k: each position's
    own acceptance given the one before (Lab 1's tau_from_positions), up to new_k; beyond k, every further draft
    accepted as often as draft k was given draft k-1 (0 where no step reached k-1)."""
    if new_k < 1:
        raise ValueError(f"new_k must be >= 1, got {new_k}")
    alphas = [0.0 if math.isnan(a) else a for a in conditional_acceptance_by_position(histogram)]
    if not alphas:
        raise ValueError(f"a histogram of k >= 1 drafts is needed, got {histogram}")
    alphas += [alphas[-1]] * (new_k - len(alphas))
    return tau_from_positions(alphas[:new_k])


def tau_from_histogram(histogram: list[int]) -> float:
    """Tokens per verify step (tau): mean accepted drafts + 1, read from the histogram."""
    return 1 + sum(i * h for i, h in enumerate(histogram)) / sum(histogram)


@dataclass
class SpecStats:
    """A request's speculative counters from its final meta_info, whatever the version named them."""

    verify_ct: int
    correct_drafts: int | None = None
    proposed_drafts: int | None = None
    histogram: list[int] | None = None
    server_accept_length: float | None = None  # the server's own spec_accept_length (SGLang's accept length is our tau)

    @classmethod
    def from_meta(cls, meta: dict) -> SpecStats | None:
        """None for plain decoding (0.5.10+ omit the fields when spec_verify_ct is 0; 0.5.5 sends 0)."""
        ct = meta.get("spec_verify_ct")
        if not ct:
            return None
        hist = _first(meta, HISTOGRAM)
        return cls(int(ct), _first(meta, CORRECT_DRAFTS), _first(meta, PROPOSED_DRAFTS),
                   [int(h) for h in hist] if hist else None, meta.get("spec_accept_length"))


# ----- one request
@dataclass
class RequestRecord:
    """One request as the client saw it: the server's token counts and the client's clock (seconds)."""

    kind: str  # generate, completions or chat
    e2e_latency: float  # client clock, request sent to last byte
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    ttft: float | None = None  # streaming only
    itl: list[float] = field(default_factory=list)  # one entry per token after the first chunk: gap / tokens in chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each streamed chunk
    text: str = ""
    finish_reason: Any = None
    spec: SpecStats | None = None
    meta_info: dict = field(default_factory=dict)  # native /generate: the final meta_info as sent
    usage: dict = field(default_factory=dict)  # OpenAI endpoints: the usage block as sent
    server_e2e_latency: float | None = None
    output_ids: list[int] | None = None  # native /generate: the token ids as sent (a stream's last chunk has them all)
    prompt: str | None = None  # the prompt sent, where the sender recorded it (bench.send)

    @property
    def tau(self) -> float | None:
        """Tokens per verify step (records.tau); None without speculative counters."""
        if self.spec is None or self.completion_tokens is None:
            return None
        return tau(self.completion_tokens, self.spec.verify_ct)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (completion_tokens - 1)."""
        if self.ttft is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e_latency - self.ttft) / (self.completion_tokens - 1)

    @property
    def verify_time(self) -> float | None:
        """Seconds per verify step while decoding: (e2e - ttft) / spec_verify_ct."""
        if self.ttft is None or self.spec is None:
            return None
        return (self.e2e_latency - self.ttft) / self.spec.verify_ct

    def summary(self, ids: bool = False) -> dict:
        """The record without its text and ITL list, for JSON results; ids: with its prompt and output token ids
        (to replay a server's text elsewhere: benchmarks/cpu_tree_sglang_text.py)."""
        out = {"kind": self.kind, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "e2e_latency": self.e2e_latency, "ttft": self.ttft, "tpot": self.tpot, "chunks": len(self.chunk_tokens)}
        if self.spec is not None:
            out.update(spec_verify_ct=self.spec.verify_ct, accept_length=self.tau,  # tau, under the results files' key
                       spec_correct_drafts_histogram=self.spec.histogram)
        if ids:
            out.update(prompt=self.prompt, output_ids=self.output_ids)
        return out


def _cumulative_tokens(kind: str, chunk: dict) -> int | None:
    if kind == "generate":
        return (chunk.get("meta_info") or {}).get("completion_tokens")
    return (chunk.get("usage") or {}).get("completion_tokens")  # present with continuous_usage_stats


def _text_piece(kind: str, chunk: dict) -> str:
    choices = chunk.get("choices") or [{}]
    if kind == "completions":
        return choices[0].get("text") or ""
    if kind == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return chunk.get("text") or ""


def _finish(record: RequestRecord, kind: str, last: dict, usage: dict) -> RequestRecord:
    if kind == "generate":
        meta = last.get("meta_info") or {}
        record.meta_info = meta
        record.completion_tokens = meta.get("completion_tokens")
        record.prompt_tokens = meta.get("prompt_tokens")
        record.finish_reason = meta.get("finish_reason")
        record.server_e2e_latency = meta.get("e2e_latency")
        record.spec = SpecStats.from_meta(meta)
        record.output_ids = last.get("output_ids")
    else:
        record.usage = usage
        record.completion_tokens = usage.get("completion_tokens")
        record.prompt_tokens = usage.get("prompt_tokens")
    return record


def record_from_response(kind: str, body: dict, latency: float) -> RequestRecord:
    """A non-streaming answer of /generate, /v1/completions or /v1/chat/completions."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rec = RequestRecord(kind, latency)
    if kind == "generate":
        rec.text = body.get("text") or ""
    else:
        choice = (body.get("choices") or [{}])[0]
        rec.text = choice.get("text") if kind == "completions" else (choice.get("message") or {}).get("content") or ""
        rec.finish_reason = choice.get("finish_reason")
    return _finish(rec, kind, body, body.get("usage") or {})


def record_from_stream(kind: str, events: Iterable[tuple[float, dict]], t_end: float) -> RequestRecord:
    """Fold a stream's parsed SSE chunks, each with its arrival time (seconds after the request was sent).

    A speculative step often delivers several tokens in one chunk: its gap to the previous chunk is
    divided by the tokens it carries (the server's cumulative count), one ITL entry per token.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rec = RequestRecord(kind, t_end)
    last, usage, seen, prev_t, gaps = {}, {}, 0, None, []
    for t, chunk in events:
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise ValueError(f"the server reported an error mid-stream: {message}")
        if chunk.get("usage"):
            usage = chunk["usage"]
        if kind != "generate" and not chunk.get("choices"):
            continue  # the closing usage-only chunk of include_usage
        last = chunk
        if kind == "chat" or kind == "completions":
            choice = chunk["choices"][0]
            rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
        piece = _text_piece(kind, chunk)
        rec.text = piece if kind == "generate" and piece.startswith(rec.text) else rec.text + piece
        total = _cumulative_tokens(kind, chunk)
        n = None if total is None else total - seen
        seen = total if total is not None else seen
        if n == 0 or (n is None and not piece):
            continue  # a chunk with no new token (the role-only opening of chat, a keep-alive)
        if rec.ttft is None:
            rec.ttft = t
        else:
            gaps.append((t - prev_t, n))
        prev_t = t
        rec.chunk_tokens.append(n)
    _finish(rec, kind, last, usage)
    if None in rec.chunk_tokens:
        # No per-chunk counts (an OpenAI stream without continuous usage): only one token per chunk is certain.
        if rec.completion_tokens is not None and rec.completion_tokens == len(rec.chunk_tokens):
            rec.chunk_tokens = [1] * len(rec.chunk_tokens)
            gaps = [(g, 1) for g, _ in gaps]
        else:
            rec.chunk_tokens, gaps = [], []
    for gap, n in gaps:
        rec.itl.extend([gap / n] * n)
    return rec


def aggregate_acceptance(records: Iterable[RequestRecord]) -> dict:
    """Across requests, weighted by tokens: tau = sum(completion_tokens - 1) / sum(spec_verify_ct), and
    SGLang's definition sum(completion_tokens) / sum(spec_verify_ct) beside it. The keys are those of the
    results files: "accept_length" holds tau."""
    recs = [r for r in records if r.spec is not None and r.completion_tokens is not None]
    if not recs:
        return {"requests": 0, "accept_length": None, "accept_length_sglang": None, "acceptance_by_position": None}
    ct = sum(r.spec.verify_ct for r in recs)
    tokens = sum(r.completion_tokens for r in recs)
    hists = [r.spec.histogram for r in recs if r.spec.histogram]
    by_pos = None
    if hists and len(hists) == len(recs):
        width = max(map(len, hists))
        by_pos = acceptance_by_position([sum(h[i] for h in hists if i < len(h)) for i in range(width)])
    return {"requests": len(recs), "completion_tokens": tokens, "spec_verify_ct": ct,
            "accept_length": pooled_tau((r.completion_tokens, 1, r.spec.verify_ct) for r in recs),
            "accept_length_sglang": tokens / ct,
            "acceptance_by_position": by_pos}


# ----- /server_info
@dataclass
class ServerInfo:
    """What /server_info (or /get_server_info) says about the running server."""

    version: str | None
    speculative_algorithm: str | None
    num_steps: int | None
    topk: int | None
    num_draft_tokens: int | None
    max_running_requests: int | None
    avg_spec_accept_length: float | None  # lifetime average since the last /flush_cache; lags (decode-log-interval)
    last_gen_throughput: float | None
    step_time: dict[int, float]  # batch size -> median seconds per decode step (SGLANG_RECORD_STEP_TIME=1; 0.5.16 has it)
    raw: dict

    @classmethod
    def parse(cls, d: dict) -> ServerInfo:
        states = [s for s in d.get("internal_states") or [] if isinstance(s, dict)]
        accept = [s["avg_spec_accept_length"] for s in states if s.get("avg_spec_accept_length") is not None]
        thr = [s["last_gen_throughput"] for s in states if s.get("last_gen_throughput") is not None]
        steps: dict[int, list[float]] = {}
        for s in states:
            for bs, times in (s.get("step_time_dict") or {}).items():
                steps.setdefault(int(bs), []).extend(times if isinstance(times, list) else [times])
        mrr = d.get("max_running_requests") or next(
            (s.get("effective_max_running_requests_per_dp") for s in states if s.get("effective_max_running_requests_per_dp")),
            None)
        return cls(d.get("version"), d.get("speculative_algorithm"), d.get("speculative_num_steps"),
                   d.get("speculative_eagle_topk"), d.get("speculative_num_draft_tokens"), mrr,
                   statistics.fmean(accept) if accept else None, sum(thr) if thr else None,
                   {bs: statistics.median(v) for bs, v in sorted(steps.items()) if v}, d)

    def step_time_at(self, width: int) -> float | None:
        """Seconds per decode step at `width` rows, or at the widest batch the server ran below it: at high
        concurrency rows finish and are admitted between steps, so a full batch can be rare or never seen."""
        below = [bs for bs in self.step_time if bs <= width]
        return self.step_time[max(below)] if below else None


# ----- /metrics (Prometheus text format)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] for every sample line."""
    out: dict[str, list] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        out.setdefault(m[1], []).append((dict(_LABEL.findall(m[2] or "")), value))
    return out


@dataclass
class MetricsSnapshot:
    """The counters and gauges the course reads, summed (counters) or averaged (gauges) over ranks."""

    spec_accept_length: float | None  # the last logging interval's, per SGLang
    spec_verify_calls_total: float | None  # 0.5.14+
    generation_tokens_total: float | None
    num_running_reqs: float | None
    samples: dict[str, list[tuple[dict[str, str], float]]]

    @classmethod
    def parse(cls, text: str) -> MetricsSnapshot:
        s = parse_prometheus(text)

        def total(name):
            return sum(v for _, v in s[name]) if name in s else None

        def mean(name):
            return statistics.fmean(v for _, v in s[name]) if s.get(name) else None

        return cls(mean("sglang:spec_accept_length"), total("sglang:spec_verify_calls_total"),
                   total("sglang:generation_tokens_total"), total("sglang:num_running_reqs"), s)


def interval_accept_length(before: MetricsSnapshot, after: MetricsSnapshot) -> float | None:
    """Accept length between two snapshots, SGLang's definition: delta generation tokens / delta verify calls."""
    if None in (before.spec_verify_calls_total, after.spec_verify_calls_total,
                before.generation_tokens_total, after.generation_tokens_total):
        return None
    calls = after.spec_verify_calls_total - before.spec_verify_calls_total
    return (after.generation_tokens_total - before.generation_tokens_total) / calls if calls > 0 else None
