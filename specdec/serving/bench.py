"""A concurrency sweep against one server: for each concurrency and prompt category, a closed loop of
streamed requests (as many in flight as the concurrency), the cache flushed before each run; output
tokens/s, TTFT/ITL/TPOT percentiles and accept length, from the server's token counts.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm.auto import tqdm

from specdec.serving.client import Client, ClientError
from specdec.serving.prompts import CATEGORIES, prompts
from specdec.serving.records import RequestRecord, aggregate_acceptance, interval_accept_length

SCHEMA = "specdec-bench/1"
ENDPOINTS = ("generate", "completions", "chat")


@dataclass
class SweepConfig:
    url: str
    categories: tuple[str, ...] = CATEGORIES
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_new_tokens: int = 128
    requests_per_run: int | None = None  # default: max(2 * concurrency, 8), so each run has two full waves
    warmup: int = 2
    endpoint: str = "generate"
    temperature: float = 0.0
    ignore_eos: bool = True  # every request decodes max_new_tokens, as SGLang's benchmark does
    flush: bool = True  # /flush_cache before each run (also resets the server's acceptance average)
    api_key: str | None = field(default=None, repr=False)

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
        if self.warmup < 0 or self.temperature < 0:
            raise ValueError("warmup and temperature must be >= 0")

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
        return client.generate(prompt, cfg.max_new_tokens, cfg.temperature, ignore_eos=cfg.ignore_eos)
    call = client.completion if cfg.endpoint == "completions" else client.chat
    return call(prompt, cfg.max_new_tokens, cfg.temperature, ignore_eos=cfg.ignore_eos)


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


def summarize(records: list[RequestRecord], wall: float) -> dict:
    """One run's figures: throughput from the server's token counts, latency percentiles, acceptance."""
    tokens = sum(r.completion_tokens or 0 for r in records)
    acc = aggregate_acceptance(records)
    return {"requests_ok": len(records), "wall_s": wall, "output_tokens": tokens,
            "output_tok_s": tokens / wall if wall > 0 else None,
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


def run_sweep(cfg: SweepConfig, progress: bool = True) -> dict:
    """Warm up, then one run per (concurrency, category); returns the JSON-able results."""
    client = Client(cfg.url, api_key=cfg.api_key)
    server = _server(client)  # raises ClientError if the server cannot be reached
    notes = []
    cap = server["max_running_requests"]
    if cap and max(cfg.concurrency) > cap:
        notes.append(f"the server runs at most {cap} requests at once: levels above it queue")
    if cfg.warmup:
        warm = [p for c in cfg.categories for p in prompts(c)][: cfg.warmup]
        run_requests(client, cfg, warm, min(len(warm), max(cfg.concurrency)))
    total = sum(cfg.requests_for(c) for c in cfg.concurrency) * len(cfg.categories)
    runs = []
    with tqdm(total=total, desc="bench", unit="req", disable=not progress, mininterval=0.5) as bar:
        for conc in cfg.concurrency:
            for cat in cfg.categories:
                bar.set_description(f"{cat} c={conc}")
                flushed = client.flush_cache() if cfg.flush else False
                before = client.metrics()
                pool = prompts(cat)
                texts = [pool[i % len(pool)] for i in range(cfg.requests_for(conc))]
                records, errors, wall = run_requests(client, cfg, texts, conc, bar)
                after = client.metrics() if before is not None else None
                run = {"category": cat, "concurrency": conc, "requests": len(texts), "errors": len(errors),
                       "error_examples": errors[:3], "flushed": flushed, **summarize(records, wall),
                       "server_avg_accept_length": client.server_info().avg_spec_accept_length,
                       "metrics_accept_length": interval_accept_length(before, after) if after else None,
                       "records": [r.summary() for r in records]}
                runs.append(run)
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
    cols = f"{'category':<12}{'conc':>5}{'req':>5}{'err':>4}{'tok/s':>10}{'TTFT p50':>10}{'p99':>8}" \
           f"{'ITL p50':>9}{'p95':>7}{'p99':>7}{'TPOT p50':>10}{'accept':>8}"
    lines = [head, cols]
    for r in result["runs"]:
        tau = f"{r['accept_length']:.2f}" if r["accept_length"] is not None else "-"
        tok_s = f"{r['output_tok_s']:.1f}" if r["output_tok_s"] else "-"
        lines.append(f"{r['category']:<12}{r['concurrency']:>5}{r['requests']:>5}{r['errors']:>4}{tok_s:>10}"
                     f"{_ms(r['ttft_s']):>10}{_ms(r['ttft_s'], 'p99'):>8}{_ms(r['itl_s']):>9}{_ms(r['itl_s'], 'p95'):>7}"
                     f"{_ms(r['itl_s'], 'p99'):>7}{_ms(r['tpot_s']):>10}{tau:>8}")
    lines.append("accept = (completion_tokens - 1) / spec_verify_ct summed over the run's requests (token-weighted)")
    return "\n".join(lines + [f"note: {n}" for n in result.get("notes", [])])
