"""A concurrency sweep against one server: for each concurrency and prompt category, a closed loop of
streamed requests (as many in flight as the concurrency), the cache flushed before each run; output
tokens/s with a bootstrap interval, TTFT/ITL/TPOT percentiles and tau (tokens per verify step), from the
server's token counts.

Measuring what it says: a server may compile or capture lazily (`specdec serve` captures a CUDA graph per
batch width and cache span the first time it meets one), so every concurrency level is warmed by one
untimed wave at that level (every category, the same max_new_tokens) before its runs are timed. A run
keeps its closed loop going until it has sent `requests_for(c)` requests AND lasted `min_run_s` seconds
AND produced `min_tokens` tokens: 5 s by default, enough on a GPU for launch jitter to average out;
notebooks and tests on a small CPU pass 0. Each run carries a 95% bootstrap interval of its tokens/s
(requests resampled), and `repeats` > 1 measures each run several times and pools them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm.auto import tqdm

from specdec.serving.measure.client import Client, ClientError
from specdec.serving.measure.prompts import DEFAULT_CATEGORIES, prompts
from specdec.serving.measure.records import RequestRecord, aggregate_acceptance, interval_accept_length

SCHEMA = "specdec-bench/2"
SCHEMAS = ("specdec-bench/1", SCHEMA)  # /1 files (no interval, no level warm-up) still load
DEFAULT_MIN_RUN_S = 5.0  # several seconds per run on a GPU; pass 0 on a small CPU
BOOTSTRAP = 2000  # resamples for the intervals
ENDPOINTS = ("generate", "completions", "chat")


@dataclass
class SweepConfig:
    """What to sweep. A run at concurrency c sends at least requests_for(c) requests and keeps its closed
    loop going until it has also lasted min_run_s seconds and produced min_tokens tokens (default 5 s: on
    a GPU a step takes milliseconds, and runs of a fraction of a second measured launch jitter and lazy
    captures; on a small CPU, where 8 requests already take seconds, pass 0). warm_levels sends one
    untimed wave at each level first; repeats > 1 measures each run again and pools the repeats."""

    url: str
    categories: tuple[str, ...] = DEFAULT_CATEGORIES
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_new_tokens: int = 128
    requests_per_run: int | None = None  # default: max(2 * concurrency, 8), so each run has two full waves
    warmup: int = 2  # requests sent once before anything, to load the server
    endpoint: str = "generate"
    temperature: float = 0.0
    ignore_eos: bool = True  # every request decodes max_new_tokens, as SGLang's benchmark does
    flush: bool = True  # /flush_cache before each run (also resets the server's acceptance average)
    api_key: str | None = field(default=None, repr=False)
    # new fields last, so that positional callers keep working
    min_run_s: float = DEFAULT_MIN_RUN_S  # each run lasts at least this long (seconds) ...
    min_tokens: int = 0  # ... and produces at least this many output tokens
    repeats: int = 1  # measure each run this many times and pool them
    warm_levels: bool = True  # one untimed wave at each concurrency before timing it
    keep_ids: bool = False  # each record in the results with its prompt and output token ids (/generate only)

    def __post_init__(self):
        self.categories, self.concurrency = tuple(self.categories), tuple(self.concurrency)
        for c in self.categories:
            prompts(c)  # raises on an unknown category
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.max_new_tokens < 2:
            raise ValueError(f"max_new_tokens must be >= 2 (TPOT needs a second token), got {self.max_new_tokens}")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {self.endpoint!r}")
        if self.requests_per_run is not None and self.requests_per_run < 1:
            raise ValueError(f"requests_per_run must be >= 1, got {self.requests_per_run}")
        if self.warmup < 0 or self.temperature < 0 or self.min_run_s < 0 or self.min_tokens < 0:
            raise ValueError("warmup, temperature, min_run_s and min_tokens must be >= 0")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")

    def requests_for(self, concurrency: int) -> int:
        return self.requests_per_run or max(2 * concurrency, 8)


def percentiles(values) -> dict | None:
    """p50/p95/p99 and mean (seconds), or None for no values."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return None
    p50, p95, p99 = np.percentile(v, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(v.mean())}


def send(client: Client, cfg: SweepConfig, prompt: str) -> RequestRecord:
    if cfg.endpoint == "generate":
        rec = client.generate(prompt, cfg.max_new_tokens, cfg.temperature, ignore_eos=cfg.ignore_eos)
    else:
        call = client.completion if cfg.endpoint == "completions" else client.chat
        rec = call(prompt, cfg.max_new_tokens, cfg.temperature, ignore_eos=cfg.ignore_eos)
    rec.prompt = prompt
    return rec


def run_requests(client: Client, cfg: SweepConfig, texts: list[str], concurrency: int,
                 bar=None) -> tuple[list[RequestRecord], list[str], float]:
    """Send every prompt with `concurrency` in flight; (records, errors, wall seconds)."""
    records, errors = [], []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(send, client, cfg, t) for t in texts]
        for fut in as_completed(futures):
            try:
                records.append(fut.result())
            except ClientError as exc:
                errors.append(str(exc))
            if bar is not None:
                bar.update(1)
    return records, errors, time.perf_counter() - t0


def closed_loop(client: Client, cfg: SweepConfig, pool: list[str], concurrency: int, min_requests: int,
                bar=None) -> tuple[list[RequestRecord], list[str], float]:
    """`concurrency` workers each send one request after another (prompts cycled from `pool`) until the
    run has sent min_requests and lasted cfg.min_run_s and produced cfg.min_tokens; a worker stops only
    after seeing the floors met, so the last one out ends the run past them. (records, errors, wall)."""
    records, errors, lock = [], [], threading.Lock()
    state = {"sent": 0, "tokens": 0, "broken": False}
    t0 = time.perf_counter()

    def done() -> bool:
        return state["broken"] or (state["sent"] >= min_requests and time.perf_counter() - t0 >= cfg.min_run_s
                and state["tokens"] >= cfg.min_tokens)

    def worker():
        while True:
            with lock:
                if done():
                    return
                text = pool[state["sent"] % len(pool)]
                state["sent"] += 1
            try:
                rec, err = send(client, cfg, text), None
            except ClientError as exc:
                rec, err = None, str(exc)
            with lock:
                if rec is not None:
                    records.append(rec)
                    state["tokens"] += rec.completion_tokens or 0
                else:
                    errors.append(err)
                    state["broken"] = len(errors) >= max(8, min_requests)  # give up rather than loop on errors
            if bar is not None:
                bar.update(1)

    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        for fut in [ex.submit(worker) for _ in range(concurrency)]:
            fut.result()
    return records, errors, time.perf_counter() - t0


def bootstrap_tok_s(records: list[dict], tok_s: float | None, n: int = BOOTSTRAP, seed: int = 0) -> np.ndarray | None:
    """Resampled output tok/s of one run: requests are resampled with replacement and the measured tok/s
    scaled by how the resample's tokens per request-second (sum tokens / sum e2e latency) compares with
    the run's (in a closed loop, throughput = concurrency x that rate). Where the records come from
    several repeats ("repeat" field), the repeats are resampled first and then the requests within each
    (a two-level bootstrap), so that drift between repeats widens the interval. None without records."""
    rows = [r for r in records if r.get("e2e_latency")]
    if not tok_s or not rows or not sum(r.get("completion_tokens") or 0 for r in rows):
        return None
    groups = {}
    for r in rows:
        groups.setdefault(r.get("repeat", 0), []).append(r)
    rng = np.random.default_rng(seed)
    g = len(groups)
    tok_sums, e2e_sums = np.zeros((g, g, n)), np.zeros((g, g, n))  # group k resampled for draw position j
    for k, grp in enumerate(groups.values()):
        tok = np.array([r.get("completion_tokens") or 0 for r in grp], dtype=float)
        e2e = np.array([r["e2e_latency"] for r in grp], dtype=float)
        idx = rng.integers(0, tok.size, size=(g, n, tok.size))
        tok_sums[k], e2e_sums[k] = tok[idx].sum(-1), e2e[idx].sum(-1)
    pick = rng.integers(0, g, size=(g, n)) if g > 1 else np.zeros((1, n), dtype=int)
    pos, col = np.arange(g)[:, None], np.arange(n)[None, :]
    rate = tok_sums[pick, pos, col].sum(0) / e2e_sums[pick, pos, col].sum(0)
    tok_all = sum(r.get("completion_tokens") or 0 for r in rows)
    return tok_s * rate / (tok_all / sum(r["e2e_latency"] for r in rows))


def interval(samples: np.ndarray | None, level: float = 0.95) -> list[float] | None:
    """The central `level` percentile interval of bootstrap samples."""
    if samples is None:
        return None
    lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return [float(lo), float(hi)]


def summarize(records: list[RequestRecord], wall: float) -> dict:
    """One run's figures: throughput from the server's token counts, latency percentiles, acceptance."""
    tokens = sum(r.completion_tokens or 0 for r in records)
    acc = aggregate_acceptance(records)
    tok_s = tokens / wall if wall > 0 else None
    return {"requests_ok": len(records), "wall_s": wall, "output_tokens": tokens, "output_tok_s": tok_s,
            "output_tok_s_ci95": interval(bootstrap_tok_s([r.summary() for r in records], tok_s)),
            "ttft_s": percentiles(r.ttft for r in records), "itl_s": percentiles(x for r in records for x in r.itl),
            "tpot_s": percentiles(r.tpot for r in records), "e2e_s": percentiles(r.e2e_latency for r in records),
            "accept_length": acc["accept_length"], "accept_length_sglang": acc["accept_length_sglang"],
            "spec_verify_ct": acc.get("spec_verify_ct"), "spec_requests": acc["requests"],
            "spec_completion_tokens": acc.get("completion_tokens"),
            "acceptance_by_position": acc["acceptance_by_position"],
            "verify_time_s": percentiles(r.verify_time for r in records)}


def _server(client: Client) -> dict:
    info = client.server_info()
    return {"version": info.version, "speculative_algorithm": info.speculative_algorithm,
            "num_steps": info.num_steps, "topk": info.topk, "num_draft_tokens": info.num_draft_tokens,
            "max_running_requests": info.max_running_requests}


def warm_level(client: Client, cfg: SweepConfig, concurrency: int) -> None:
    """One untimed wave at `concurrency`: max(concurrency, categories) requests, the categories' prompts
    in turn, so the batch widths and cache spans the timed runs reach are compiled or captured first."""
    pools = [prompts(c) for c in cfg.categories]
    texts = [pools[i % len(pools)][i // len(pools) % len(pools[i % len(pools)])]
             for i in range(max(concurrency, len(pools)))]
    run_requests(client, cfg, texts, concurrency)


def measure(client: Client, cfg: SweepConfig, cat: str, conc: int, bar=None) -> dict:
    """One timed run (repeated cfg.repeats times and pooled): figures, records and the repeats' tok/s."""
    records, errors, wall, flushed, repeat_tok_s, per_repeat = [], [], 0.0, True, [], []
    before = None
    for i in range(cfg.repeats):
        flushed = (client.flush_cache() if cfg.flush else False) and flushed
        if i == 0:
            before = client.metrics()
        recs, errs, w = closed_loop(client, cfg, prompts(cat), conc, cfg.requests_for(conc), bar)
        records, errors, wall = records + recs, errors + errs, wall + w
        per_repeat.append(recs)
        repeat_tok_s.append(sum(r.completion_tokens or 0 for r in recs) / w if w > 0 else None)
    after = client.metrics() if before is not None else None
    info = client.server_info()
    width = min(conc, info.max_running_requests or conc)
    run = {"category": cat, "concurrency": conc, "requests": len(records) + len(errors), "errors": len(errors),
            "error_examples": errors[:3], "flushed": flushed, "repeat_tok_s": repeat_tok_s,
            **summarize(records, wall),
            "server_avg_accept_length": info.avg_spec_accept_length,
            # seconds per decode step at this run's batch width (or the widest below it that ran), read right
            # after it (warm, as the engine ran it)
            "step_time_s": info.step_time_at(width),
            "metrics_accept_length": interval_accept_length(before, after) if after else None,
            "records": [{**r.summary(ids=cfg.keep_ids), "repeat": i} for i, recs in enumerate(per_repeat) for r in recs]}
    run["output_tok_s_ci95"] = interval(bootstrap_tok_s(run["records"], run["output_tok_s"]))  # repeats resampled too
    return run


def run_sweep(cfg: SweepConfig, progress: bool = True, report: Callable[[str], None] | None = None) -> dict:
    """Warm up, then per concurrency a warm-up wave and one timed run per category; the JSON-able results.
    `progress`: a tqdm bar; `report`: called with one short line as each concurrency level is done (a
    notebook's progress without a bar's redraws)."""
    client = Client(cfg.url, api_key=cfg.api_key)
    server = _server(client)  # raises ClientError if the server cannot be reached
    notes = []
    cap = server["max_running_requests"]
    if cap and max(cfg.concurrency) > cap:
        notes.append(f"the server runs at most {cap} requests at once: levels above it queue")
    if cfg.warmup:
        warm = [p for c in cfg.categories for p in prompts(c)][: cfg.warmup]
        run_requests(client, cfg, warm, min(len(warm), max(cfg.concurrency)))
    total = sum(cfg.requests_for(c) for c in cfg.concurrency) * len(cfg.categories) * cfg.repeats
    runs, t0 = [], time.perf_counter()
    with tqdm(total=total, desc="bench", unit="req", disable=not progress, mininterval=0.5) as bar:
        for conc in cfg.concurrency:
            if cfg.warm_levels:
                bar.set_description(f"warm-up c={conc}")
                warm_level(client, cfg, conc)
            for cat in cfg.categories:
                bar.set_description(f"{cat} c={conc}")
                runs.append(measure(client, cfg, cat, conc, bar))
            if report is not None:
                done = cfg.concurrency.index(conc) + 1
                report(f"concurrency {conc} measured ({done}/{len(cfg.concurrency)} levels, "
                       f"{time.perf_counter() - t0:.0f} s)")
    return {"schema": SCHEMA, "url": cfg.url, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "settings": {k: v for k, v in asdict(cfg).items() if k not in ("api_key", "url")},
            "server": server, "step_time": {str(k): v for k, v in client.server_info().step_time.items()},
            "notes": notes, "runs": runs}


def _ms(p: dict | None, key: str = "p50") -> str:
    return f"{p[key] * 1000:.1f}" if p else "-"


def format_sweep(result: dict) -> str:
    """The summary table of a sweep (latencies in milliseconds)."""
    s = result["server"]
    head = (f"{result['url']}  SGLang-API version {s.get('version')}  algorithm {s.get('speculative_algorithm') or 'none'}"
            f"  max_new_tokens {result['settings']['max_new_tokens']}")
    cols = f"{'category':<12}{'conc':>5}{'req':>5}{'err':>4}{'wall s':>7}{'tok/s':>10}{'95% int. tok/s':>18}" \
           f"{'TTFT p50 ms':>12}{'p99 ms':>8}{'ITL p50 ms':>11}{'p95 ms':>7}{'p99 ms':>7}{'TPOT p50 ms':>12}" \
           f"{'tok/verify':>11}"
    lines = [head, cols]
    for r in result["runs"]:
        tau = f"{r['accept_length']:.2f}" if r["accept_length"] is not None else "-"
        tok_s = f"{r['output_tok_s']:.1f}" if r["output_tok_s"] else "-"
        ci = r.get("output_tok_s_ci95")
        ci = f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "-"
        lines.append(f"{r['category']:<12}{r['concurrency']:>5}{r['requests']:>5}{r['errors']:>4}{r['wall_s']:>7.2f}"
                     f"{tok_s:>10}{ci:>18}"
                     f"{_ms(r['ttft_s']):>12}{_ms(r['ttft_s'], 'p99'):>8}{_ms(r['itl_s']):>11}{_ms(r['itl_s'], 'p95'):>7}"
                     f"{_ms(r['itl_s'], 'p99'):>7}{_ms(r['tpot_s']):>12}{tau:>11}")
    lines.append("95% interval: bootstrap over the run's requests; every level warmed before it is timed"
                 if result.get("schema") != "specdec-bench/1" else "an old (/1) sweep: levels not warmed, no interval")
    lines.append("tok/s: output tokens per second over all the run's requests; ms: milliseconds; tok/verify (accept "
                 "length) = (completion_tokens - 1) / spec_verify_ct summed over the run's requests (token-weighted)")
    return "\n".join(lines + [f"note: {n}" for n in result.get("notes", [])])
