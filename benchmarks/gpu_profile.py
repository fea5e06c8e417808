"""Where the Lab 2 decoder's batch-1 step spends its time on a GPU, and what each candidate fix buys.

For the Llama-3.2-1B and Llama-3.1-8B shapes (random bf16 weights, 512 tokens of context, cache 1024):
  kernels    torch.profiler over eager plain steps (no graph: a profiler replaying a captured graph
             crashed in gpu_floor.py): device time per step by kernel, and the number of kernels
  attention  one layer's decode attention (T = 1 and 4 query positions, span 1024) through SDPA's
             backends and as plain matmul-softmax-matmul, eager and compiled
  matmul     y = x W^T at one row for every weight shape, over enough distinct weights to leave
             the L2 cache: cuBLAS (F.linear), a compiled reduction, and a small Triton GEMV
  variants   the engine's graphed plain step with each candidate swapped in, with and without
             torch.compile (and inductor's coordinate-descent tuning)
Results go to one JSON and a log beside it, rewritten after each measurement (an error is recorded
and the rest go on).

usage: PYTHONPATH=. python3 benchmarks/gpu_profile.py --out $OUT/profile.json [--budget-s 520]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_bench import cuda_time  # noqa: E402
from gpu_floor import Plan, Run, build, bundle_of, copy_bandwidth, random_prompts, step_row  # noqa: E402

import specdec.decoder.cuda_graphs as graphs_mod  # noqa: E402
import specdec.decoder.model as model_mod  # noqa: E402
import specdec.decoder.step as step_mod  # noqa: E402
from specdec.decoder.kv_cache import KVCache  # noqa: E402
from specdec.decoder.engine import Engine, SamplingParams  # noqa: E402

SDPA = F.scaled_dot_product_attention
LINEAR = F.linear


# -- candidates ------------------------------------------------------------------------------------
def manual_attention(q, k, v, attn_mask=None, **kw):
    """Decode attention as two matmuls and a softmax: cuBLAS spreads the keys over the whole GPU."""
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)  # [B, nkv, gT, S]
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return (s.float().softmax(-1).to(q.dtype)) @ v


try:
    import triton
    import triton.language as tl

    @triton.autotune(configs=[triton.Config({"BN": bn, "BK": bk}, num_warps=w)
                              for bn in (4, 8, 16, 32) for bk in (256, 512, 1024) for w in (4, 8)], key=["N", "K"])
    @triton.jit
    def _gemv(x_ptr, w_ptr, y_ptr, N, K, BN: tl.constexpr, BK: tl.constexpr):
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        acc = tl.zeros((BN, BK), dtype=tl.float32)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
            acc += w.to(tl.float32) * x[None, :]
        tl.store(y_ptr + rn, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=rn < N)

    def triton_gemv(x, w, bias=None):
        """x [.., K] with one row, w [N, K] -> [.., N]; other shapes go to cuBLAS."""
        if x.numel() != x.shape[-1] or bias is not None or not x.is_cuda:
            return LINEAR(x, w, bias)
        N, K = w.shape
        y = torch.empty(*x.shape[:-1], N, device=x.device, dtype=x.dtype)
        _gemv[lambda meta: (triton.cdiv(N, meta["BN"]),)](x.contiguous(), w, y, N, K)
        return y
except Exception as exc:  # noqa: BLE001  (recorded below)
    triton_gemv = None
    TRITON_ERROR = f"{type(exc).__name__}: {exc}"
else:
    TRITON_ERROR = None


class Swap:
    """Swap the readable paths back in (or a candidate) for the duration of a measurement."""

    def __init__(self, attention=None, linear=None, sdpa=False, cublas=False, sampling_path=False, cdt=False,
                 inductor=None):
        self.attention, self.linear, self.sdpa, self.cublas = attention, linear, sdpa, cublas
        self.sampling_path, self.cdt, self.inductor = sampling_path, cdt, inductor

    def __enter__(self):
        import torch._inductor.config as ic
        self.saved = (F.scaled_dot_product_attention, F.linear, model_mod.DECODE_ROWS, model_mod.Linear.forward,
                      step_mod.Rows.sampling, ic.coordinate_descent_tuning, graphs_mod.INDUCTOR_OPTIONS)
        graphs_mod.INDUCTOR_OPTIONS = {"coordinate_descent_tuning": self.cdt, **(self.inductor or {})}
        if self.attention:
            F.scaled_dot_product_attention = self.attention
        if self.linear:
            F.linear = self.linear
        if self.sdpa:
            model_mod.DECODE_ROWS = 0
        if self.cublas:
            model_mod.Linear.forward = torch.nn.Linear.forward
        if self.sampling_path:  # greedy rows down the sampling code (one-hot distributions), as before the fast path
            step_mod.Rows.sampling = property(lambda self: True, lambda self, v: None)
        ic.coordinate_descent_tuning = self.cdt

    def __exit__(self, *a):
        import torch._inductor.config as ic
        (F.scaled_dot_product_attention, F.linear, model_mod.DECODE_ROWS, model_mod.Linear.forward,
         step_mod.Rows.sampling, ic.coordinate_descent_tuning, graphs_mod.INDUCTOR_OPTIONS) = self.saved
        torch._dynamo.reset()


# -- measurements ----------------------------------------------------------------------------------
def graph_time(fns, iters=20) -> float:
    """Seconds per call of each fn in fns, all captured in one CUDA graph (no launch gaps)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return cuda_time(g.replay, iters=iters, warmup=3) / len(fns)


def kernels(model, plan: Plan, steps: int = 8) -> dict:
    """Device time per eager plain step, by kernel (torch.profiler)."""
    engine = Engine(bundle_of(model, "random"), "ar", max_batch=1, max_len=1024, cuda_graphs="off")
    engine.admit(random_prompts(model.config.vocab_size, 1, plan.context), SamplingParams(max_new_tokens=steps + 8,
                                                                                           stop_at_eos=False))
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    return profile_kernels(engine.step, steps)


def profile_kernels(fn, steps: int) -> dict:
    """torch.profiler over `steps` eager calls of fn: device time and launches per call, by kernel."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type == DeviceType.CUDA:
            us = (getattr(e, "self_device_time_total", None) or e.self_cuda_time_total) / steps
            if us > 0:
                rows.append((us, e.count / steps, e.key))
    rows.sort(reverse=True)
    return {"kernel_us_per_step": sum(r[0] for r in rows), "kernels_per_step": sum(r[1] for r in rows),
            "top": [{"us": round(us, 1), "calls": c, "name": n[:140]} for us, c, n in rows[:40]]}


def attention_bench(model, span=1024, context=512) -> dict:
    cfg = model.config
    nkv, g, d = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads, cfg.head_dim
    L = cfg.num_hidden_layers
    out = {}
    Ks = [torch.randn(1, nkv, span, d, device="cuda", dtype=torch.bfloat16) for _ in range(L)]
    Vs = [torch.randn_like(k) for k in Ks]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for T in (1, 4):
        q = torch.randn(1, nkv, g * T, d, device="cuda", dtype=torch.bfloat16)
        pos = context + torch.arange(T, device="cuda")
        mask = (torch.arange(span, device="cuda") <= pos.view(T, 1)).repeat(g, 1).view(1, 1, g * T, span)
        ref = manual_attention(q.float(), Ks[0].float(), Vs[0].float(), mask)
        cands = {"sdpa_auto": lambda q, k, v: SDPA(q, k, v, attn_mask=mask),
                 "manual": lambda q, k, v: manual_attention(q, k, v, mask)}
        for name, be in (("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa_math", SDPBackend.MATH),
                         ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            def f(q, k, v, be=be):
                with sdpa_kernel(be):
                    return SDPA(q, k, v, attn_mask=mask)
            cands[name] = f
        cands["manual_compiled"] = torch.compile(lambda q, k, v: manual_attention(q, k, v, mask), dynamic=False)
        for name, f in cands.items():
            try:
                err = (f(q, Ks[0], Vs[0]).float() - ref).abs().max().item()
                t = graph_time([lambda i=i: f(q, Ks[i], Vs[i]) for i in range(L)])
                out[f"T{T}/{name}"] = {"us": round(t * 1e6, 2), "max_err": err}
            except Exception as exc:  # noqa: BLE001
                out[f"T{T}/{name}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    torch._dynamo.reset()
    return out


def matmul_bench(model, bw: float) -> dict:
    cfg = model.config
    H, I = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    shapes = {"qkv": (q + 2 * kv, H), "o": (H, q), "gate_up": (2 * I, H), "down": (H, I), "lm_head": (cfg.vocab_size, H)}
    red = torch.compile(lambda x, w: (x.float() * w.float()).sum(-1).to(x.dtype), dynamic=False)
    out = {"triton_error": TRITON_ERROR}
    import torch._inductor.config as ic
    for name, (N, K) in shapes.items():
        nbytes = N * K * 2
        n = max(2, math.ceil(600e6 / nbytes))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(n)]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        ref = LINEAR(x.float(), ws[0].float())
        row = {"N": N, "K": K, "MB": round(nbytes / 1e6, 1), "floor_us": round(nbytes / bw * 1e6, 2)}
        cands = {"cublas": LINEAR}
        if triton_gemv:
            cands["triton"] = triton_gemv
        ic.coordinate_descent_tuning = True
        cands["inductor_reduction"] = red
        for cname, f in cands.items():
            try:
                err = (f(x, ws[0]).float() - ref).abs().max().item()
                t = graph_time([lambda w=w: f(x, w) for w in ws])
                row[cname] = {"us": round(t * 1e6, 2), "x_floor": round(t / (nbytes / bw), 3), "max_err": round(err, 4)}
            except Exception as exc:  # noqa: BLE001
                row[cname] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        ic.coordinate_descent_tuning = False
        out[name] = row
        del ws
    torch._dynamo.reset()
    return out


VARIANTS = {  # name: (Swap kwargs, compile, width)
    "graph": ({}, False, 1),
    "graph, as before (sdpa, sampling path)": ({"sdpa": True, "sampling_path": True}, False, 1),
    "graph, sdpa": ({"sdpa": True}, False, 1),
    "compile": ({}, True, 1),
    "compile+cdt": ({"cdt": True}, True, 1),
    "compile+cdt, verify w=4": ({"cdt": True}, True, 4),
    "compile+cdt, realize_opcount 8": ({"cdt": True, "inductor": {"realize_opcount_threshold": 8}}, True, 1),
    "compile+cdt, realize_opcount 16": ({"cdt": True, "inductor": {"realize_opcount_threshold": 16}}, True, 1),
}


def variant(model, plan: Plan, bw: float, name: str) -> dict:
    kw, compile, width = VARIANTS[name]
    kw = dict(kw)
    if kw.get("linear") == "triton":
        if triton_gemv is None:
            raise RuntimeError(f"no triton: {TRITON_ERROR}")
        kw["linear"] = triton_gemv
    with Swap(**kw):
        return step_row(model, plan, bw, 1, 1024, width, compile)


def compiled_kernels(model, plan: Plan, cdt: bool, steps: int = 8) -> dict:
    """torch.profiler over the compiled forward of one decode position (no graph), by kernel."""
    cache = KVCache.for_model(model, 1, 1024).rows(0, 1, 1024)
    ids = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.full((1, 1), plan.context, device="cuda")
    with Swap(cdt=cdt):
        fwd = torch.compile(lambda i, p: model(i, p, cache)[0].argmax(-1), dynamic=False)
        for _ in range(3):
            fwd(ids, pos)
        torch.cuda.synchronize()
        found = profile_kernels(lambda: fwd(ids, pos), steps)
        graphed = graph_time([lambda: fwd(ids, pos)], iters=30)
    return {"graph_us": graphed * 1e6, **found}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=520.0)
    p.add_argument("--shapes", default="8b,1b")
    p.add_argument("--parts", default="variants,compiled")
    p.add_argument("--variants", default=";".join(VARIANTS), help="names of VARIANTS, separated by ';'")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(";")]
    if unknown := [v for v in variants if v not in VARIANTS]:  # before the run, not after its first half
        p.error(f"unknown variant {unknown[0]!r}; choose from {'; '.join(VARIANTS)}")
    torch.set_grad_enabled(False)
    torch._dynamo.config.recompile_limit = 256
    plan = Plan()
    run = Run(Path(args.out), args.budget_s)
    parts = args.parts.split(",")
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": getattr(sys.modules.get("triton"), "__version__", None),
           "nsys": shutil.which("nsys"), "ncu": shutil.which("ncu"), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    run.results["env"] = env
    run.log("gpu_profile:", json.dumps(env))
    bw = run.measure("bandwidth", {}, lambda: {"copy_Bps": copy_bandwidth(plan)}).get("copy_Bps", float("nan"))
    models = {}
    for shape in args.shapes.split(","):
        models[shape] = build(plan.shapes[shape], plan)
        m = models[shape]
        if "kernels" in parts:
            run.measure("kernels", {"shape": shape}, lambda: kernels(m, plan), need_s=10)
        if "attention" in parts:
            run.measure("attention", {"shape": shape}, lambda: attention_bench(m), need_s=20)
        if "matmul" in parts:
            run.measure("matmul", {"shape": shape}, lambda: matmul_bench(m, bw), need_s=30)
        del models[shape], m
    if "variants" in parts:
        for shape in args.shapes.split(","):
            m = build(plan.shapes[shape], plan)
            for name in variants:
                compile = VARIANTS[name][1]
                need = (45 if shape == "8b" else 20) if compile else 5
                run.measure("variants", {"shape": shape, "variant": name}, lambda: variant(m, plan, bw, name), need_s=need)
            del m
    if "compiled" in parts:
        for shape in args.shapes.split(","):
            m = build(plan.shapes[shape], plan)
            run.measure("compiled_kernels", {"shape": shape, "cdt": True},
                        lambda: compiled_kernels(m, plan, True), need_s=80 if shape == "8b" else 50)
            del m
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
