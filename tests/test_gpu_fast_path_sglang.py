"""benchmarks/gpu_fast_path_sglang.py's decode part runs only on a GPU node; on the CPU, its order: with --total-s
SGLang (the anchor) is measured first and ours within what is left, so that a slow SGLang start cannot cut the
anchor out of the call (it did once: benchmarks/logs/gpu_gemv.log, call 4)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_fast_path_sglang as script  # noqa: E402


def run_decode(monkeypatch, tmp_path, budget_s, total_s, sglang_s):
    clock, order = [1000.0], []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def ours(argv, **kw):
        order.append(("ours", float(argv[argv.index("--budget-s") + 1])))
        return Done()

    def sglang(out, shape):
        order.append(("sglang", shape))
        clock[0] += sglang_s  # its start and measurement take this long

    monkeypatch.setattr(script.time, "time", lambda: clock[0])
    monkeypatch.setattr(script.subprocess, "run", ours)
    monkeypatch.setattr(script, "sglang_decode", sglang)
    monkeypatch.setattr(script, "say", lambda *a: None)
    script.part_decode(tmp_path, "8b", budget_s, total_s)
    return order


def test_without_a_total_ours_runs_first_with_its_budget(monkeypatch, tmp_path):
    assert run_decode(monkeypatch, tmp_path, 190, 0, 200) == [("ours", 190.0), ("sglang", "8b")]


def test_with_a_total_the_anchor_runs_first_and_ours_gets_what_is_left(monkeypatch, tmp_path):
    assert run_decode(monkeypatch, tmp_path, 330, 570, 200) == [("sglang", "8b"), ("ours", 330.0)]
    assert run_decode(monkeypatch, tmp_path, 330, 570, 300) == [("sglang", "8b"), ("ours", 240.0)]
    assert run_decode(monkeypatch, tmp_path, 330, 570, 500) == [("sglang", "8b")]  # too little left: ours skipped


def test_sglangs_time_per_token_is_the_best_repeat_and_keeps_every_repeat(monkeypatch):
    """gpu_lab3.tpot_at_context (the anchor's figure): (best e2e at 256 tokens - best at 1) / 255, every repeat kept
    (SGLang's figure moved 1.26 to 1.84 ms between calls on one day: the repeats show whether it moved within one)."""
    import gpu_lab3

    times = {1: [0.030, 0.020, 0.025], 256: [0.60, 0.55, 0.58]}
    posted = []

    class Reply:
        def __init__(self, n):
            self.n = n

        def json(self):
            return {"meta_info": {"e2e_latency": times[self.n][sum(1 for p in posted if p == self.n) - 1]}}

    def post(url, json=None, timeout=None):
        if url.endswith("/generate"):
            n = json["sampling_params"]["max_new_tokens"]
            posted.append(n)
            return Reply(n)
        return Reply(None)

    monkeypatch.setattr(gpu_lab3.requests, "post", post)
    got = gpu_lab3.tpot_at_context("http://x", context=8, new=256, reps=3)
    assert got["e2e_1_all"] == times[1] and got["e2e_new_all"] == times[256]
    assert abs(got["tpot_s"] - (0.55 - 0.020) / 255) < 1e-12
