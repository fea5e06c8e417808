"""Is this node ready for a workshop? The facts are gathered once (gather_facts); each check is a pure
function of them, so that a test can hand in the facts of a node it does not have.

Two paths: gpu (SGLang on the node's GPUs) and cpu (`specdec serve`, the course's own server). The
exit status is 1 when a check the chosen path needs fails, else 0; the other checks are reported
(warn) with their fix. Mode auto picks what `specdec room --engine auto` would start: gpu where a GPU
and SGLang are present, else cpu.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.serving.ops import gpu as gpus_
from specdec.serving.ops.gpu import DEFAULT_HEADROOM, Gpu, MemoryPlanError, ServerNeeds, gib, memory_plan, size
from specdec.serving.ops.launch import parse_version
from specdec.serving.ops.ports import port_free

MODES = ("auto", "gpu", "cpu")
# SGLang pins torch exactly (shared/SGLANG.md), read from the released wheels: (first, last) -> torch.
TORCH_PINS = {((0, 5, 10), (0, 5, 10)): "2.9.1", ((0, 5, 12), (0, 5, 16)): "2.11.0",
              ((0, 5, 18), (0, 5, 20)): "2.13.0", ((0, 5, 22), (0, 5, 23)): "2.14.1"}
# ... and transformers: 0.5.16 imports with its pin 5.12.1 and fails with 5.17 ('qwen3_asr' is already used).
TRANSFORMERS_PINS = {(0, 5, 16): "5.12.1"}
MIN_DISK_GIB = 2.0  # logs and JIT caches (the offline pack alone unpacks to 237 MB in /tmp)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class ModelFacts:
    """One --models entry: where it is and what its directory holds (`problem` says why it cannot serve)."""

    spec: str
    path: str | None = None
    config: bool = False
    weights: bool = False
    tokenizer: bool = False
    needs: ServerNeeds = field(default_factory=lambda: ServerNeeds(0, 0))
    problem: str | None = None
    fix: str = ""


def inspect_model(spec: str, path: str | Path | None = None) -> ModelFacts:
    """A model directory: config.json, weight files (or config only, for --load-format dummy), a tokenizer."""
    d = Path(path if path is not None else spec)
    if not d.is_dir():
        return ModelFacts(spec, str(d), problem=f"{d}: no such directory",
                          fix="copy the model onto the node (an air-gapped node cannot download a hub id), then pass its "
                              "directory")
    has = {"config": (d / "config.json").is_file(),
           "weights": any(any(d.glob(p)) for p in gpus_.WEIGHT_FILES),
           "tokenizer": any((d / f).is_file() for f in TOKENIZER_FILES)}
    facts = ModelFacts(spec, str(d), **has, needs=gpus_.server_needs(d) if has["config"] else ServerNeeds(0, 0))
    if not has["config"]:
        return _with(facts, f"{d}: no config.json, not a Hugging Face model directory",
                     "pass the directory that holds config.json")
    if not has["tokenizer"]:
        return _with(facts, f"{d}: no tokenizer files ({', '.join(TOKENIZER_FILES)})",
                     "copy the tokenizer files beside config.json (SGLang and specdec serve both need them)")
    return facts


def _with(facts: ModelFacts, problem: str, fix: str) -> ModelFacts:
    return ModelFacts(facts.spec, facts.path, facts.config, facts.weights, facts.tokenizer, facts.needs, problem, fix)


@dataclass(frozen=True)
class Facts:
    """Everything the checks look at; gather_facts() reads them from this machine."""

    gpu_device: bool = False  # /dev/nvidia* exists
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    driver_cuda: str | None = None  # the newest CUDA the driver supports
    torch: str | None = None
    torch_cuda: str | None = None  # the CUDA torch was built for (None: a CPU build)
    cuda_available: bool = False
    sglang: str | None = None  # installed version
    sglang_requires: tuple[str, ...] = ()  # its metadata's requirements (torch==..., transformers==...)
    sglang_import_error: str | None = None  # the last line of `import sglang.srt.server_args` failing
    transformers: str | None = None
    fa3: bool | None = None
    deep_gemm: bool = False
    models: tuple[ModelFacts, ...] = ()
    students: int = 1
    headroom: float = DEFAULT_HEADROOM
    port_range: tuple[int, int] = (30000, 30099)
    busy_ports: tuple[int, ...] = ()
    disk_free_gib: tuple[tuple[str, float], ...] = ()
    serve_problem: str | None = None  # why `specdec serve` cannot run here


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def status(self) -> str:
        return "ok" if self.ok else ("FAIL" if self.required else "warn")


def required(check: Check, needed: bool) -> Check:
    return Check(check.name, check.ok, check.detail, check.fix, needed)


# ----- versions ------------------------------------------------------------------------------------
def base_version(v: str | None) -> str | None:
    """'2.11.0+cu130' -> '2.11.0'."""
    return None if v is None else v.split("+")[0]


def pinned(requires: tuple[str, ...], name: str) -> str | None:
    """The exact version a requirement list pins `name` to (`torch==2.11.0`, markers aside), or None."""
    for r in requires:
        m = re.fullmatch(rf"\s*{re.escape(name)}\s*==\s*([\w.]+)\s*", r.partition(";")[0], re.IGNORECASE)
        if m:
            return m[1]
    return None


def known_torch_pin(sglang_version: str) -> str | None:
    v = parse_version(sglang_version)
    return next((torch for (lo, hi), torch in TORCH_PINS.items() if lo <= v <= hi), None)


def sglang_for_torch(torch_version: str | None) -> str:
    """Which SGLang releases pin the installed torch (for the fix line)."""
    fits = [f"{'.'.join(map(str, lo))}" + (f"..{'.'.join(map(str, hi))}" if hi != lo else "")
            for (lo, hi), t in TORCH_PINS.items() if t == base_version(torch_version)]
    return f"SGLang {' or '.join(fits)} pins torch {base_version(torch_version)}" if fits else \
        f"no SGLang release this course knows pins torch {base_version(torch_version)}: install one of " + \
        ", ".join(f"torch {t} (SGLang {'.'.join(map(str, lo))})" for (lo, _), t in TORCH_PINS.items())


# ----- the checks ---------------------------------------------------------------------------------------
def check_gpu(f: Facts) -> Check:
    if not f.gpus:
        why = "an NVIDIA device file exists but nvidia-smi lists no GPU" if f.gpu_device else "no NVIDIA GPU on this machine"
        return Check("GPU", False, why, "run on the GPU node (or use the CPU path: specdec room --engine specdec)")
    return Check("GPU", True, "; ".join(f"GPU {g.index} {g.name}: {gib(g.free_bytes)} of {gib(g.total_bytes)} GiB free"
                                        for g in f.gpus))


def check_memory(f: Facts) -> Check:
    """The students' servers fit: each GPU takes ceil(students / GPUs) of them (specdec room spreads them)."""
    if not f.gpus:
        return Check("GPU memory", False, "no GPU", "see the GPU check")
    per_gpu = math.ceil(f.students / len(f.gpus))
    least = min(f.gpus, key=lambda g: g.free_bytes)
    sized = [m for m in f.models if m.config and not m.problem]
    if not sized:
        return Check("GPU memory", True, f"{gib(least.free_bytes)} GiB free on GPU {least.index}; no model to size "
                                         "servers against")
    largest = max(sized, key=lambda m: m.needs.weights_bytes)
    try:
        plan = memory_plan(least.free_bytes, per_gpu, largest.needs, f.headroom)
    except MemoryPlanError as exc:
        return Check("GPU memory", False, f"{largest.spec}: {exc}",
                     "free the GPU (nvidia-smi lists what holds it), or plan fewer students per GPU")
    busy = [g for g in f.gpus if g.free_bytes < 0.9 * g.total_bytes]
    note = f"; GPU {', '.join(str(g.index) for g in busy)} already in use by something else" if busy else ""
    return Check("GPU memory", True, f"{largest.spec} ({size(largest.needs.weights_bytes)} of weights), "
                                     f"GPU {least.index}: {plan.describe()}{note}")


def check_cuda(f: Facts) -> Check:
    if f.torch is None:
        return Check("CUDA", False, "torch is not installed", "install the torch build SGLang pins (see the sglang check)")
    if f.torch_cuda is None:
        return Check("CUDA", False, f"torch {f.torch} is a CPU build",
                     f"install the CUDA build of torch {base_version(f.torch)} (its wheel for your CUDA)")
    if f.driver_cuda and parse_version(f.driver_cuda)[:2] < parse_version(f.torch_cuda)[:2]:
        return Check("CUDA", False, f"torch {f.torch} needs CUDA {f.torch_cuda}; driver {f.driver} supports only "
                                    f"{f.driver_cuda}", "update the NVIDIA driver, or install torch built for an older CUDA")
    if not f.cuda_available:
        return Check("CUDA", False, f"torch {f.torch} (CUDA {f.torch_cuda}) cannot use the GPU",
                     "check that nvidia-smi works and that the driver supports CUDA " + f.torch_cuda)
    drv = f", driver {f.driver} (CUDA {f.driver_cuda})" if f.driver else ""
    return Check("CUDA", True, f"torch {f.torch}, CUDA {f.torch_cuda}{drv}")


def check_sglang(f: Facts) -> Check:
    if f.sglang is None:
        return Check("sglang", False, "not installed",
                     f"pip install sglang (pick the release that pins your torch: {sglang_for_torch(f.torch)}); "
                     "air-gapped: the offline pack, docs/instructor-guide.md")
    if f.sglang_import_error:
        err = f.sglang_import_error
        if "qwen3_asr" in err:
            pin = pinned(f.sglang_requires, "transformers") or TRANSFORMERS_PINS.get(parse_version(f.sglang))
            fix = f"install SGLang's transformers pin: pip install transformers=={pin or '<its pin>'} (offline: tf5121.tar.xz)"
        elif m := re.search(r"No module named '([\w.]+)'", err):
            fix = f"install {m[1].split('.')[0]} (offline: the pack's site312.tar.xz holds what the server imports)"
        else:
            fix = "fix the import error above: python -c 'import sglang.srt.server_args' shows the whole traceback"
        return Check("sglang", False, f"{f.sglang} installed, but importing its server fails: {err}", fix)
    return Check("sglang", True, f"{f.sglang} imports")


def check_torch_pin(f: Facts) -> Check:
    if f.sglang is None:
        return Check("torch pin", False, "no SGLang to check against", "see the sglang check")
    pin = pinned(f.sglang_requires, "torch") or known_torch_pin(f.sglang)
    if pin is None:
        return Check("torch pin", True, f"SGLang {f.sglang}: its torch pin is unknown here (torch {f.torch} installed)")
    if base_version(f.torch) != pin:
        return Check("torch pin", False, f"SGLang {f.sglang} pins torch {pin}, torch {f.torch} is installed",
                     f"install torch=={pin}, or the SGLang for your torch: {sglang_for_torch(f.torch)}")
    return Check("torch pin", True, f"SGLang {f.sglang} pins torch {pin}: installed")


def check_transformers(f: Facts) -> Check:
    if f.sglang is None:
        return Check("transformers", False, "no SGLang to check against", "see the sglang check")
    pin = pinned(f.sglang_requires, "transformers") or TRANSFORMERS_PINS.get(parse_version(f.sglang))
    if f.transformers is None:
        return Check("transformers", False, "not installed", "pip install transformers" + (f"=={pin}" if pin else ""))
    if pin and base_version(f.transformers) != pin:
        return Check("transformers", False, f"SGLang {f.sglang} pins transformers {pin}, {f.transformers} is installed "
                                            "(0.5.16 with 5.17 fails to import: 'qwen3_asr' is already used)",
                     f"pip install transformers=={pin} (offline: tf5121.tar.xz, first on PYTHONPATH)")
    return Check("transformers", True, f"{f.transformers}" + (f" (SGLang's pin {pin})" if pin else ""))


def check_fa3(f: Facts) -> Check:
    if f.fa3 is None:
        return Check("FA3 kernels", False, "sgl_kernel is not installed", "see the sglang check", required=False)
    if not f.fa3:
        return Check("FA3 kernels", False, "sgl_kernel has no FA3 library (the offline pack strips it)",
                     "serve with --attention-backend triton (specdec room does so by itself)", required=False)
    return Check("FA3 kernels", True, "present")


def check_deep_gemm(f: Facts) -> Check:
    if f.deep_gemm:
        return Check("deep_gemm", True, "present (EAGLE and STANDALONE capture their draft graphs with it)")
    return Check("deep_gemm", False, "missing: EAGLE and STANDALONE fail with No module named 'deep_gemm'; plain and "
                                     "NGRAM run without it", "pip install sgl-deep-gemm (offline: deepgemm.tar.xz)",
                 required=False)


def check_models(f: Facts, mode: str) -> list[Check]:
    out = []
    for m in f.models:
        if m.problem:
            out.append(Check(f"model {m.spec}", False, m.problem, m.fix))
        elif not m.weights and mode == "cpu":
            out.append(Check(f"model {m.spec}", False, f"{m.path}: config only, no weights",
                             "specdec serve needs weights; config-only directories serve on SGLang with --load-format dummy"))
        elif not m.weights:
            out.append(Check(f"model {m.spec}", True, f"{m.path}: config only: serve with --load-format dummy "
                                                      f"(random weights, about {size(m.needs.weights_bytes)})"))
        else:
            out.append(Check(f"model {m.spec}", True, f"{m.path} ({size(m.needs.weights_bytes)} of weights)"))
    return out


def check_ports(f: Facts) -> Check:
    lo, hi = f.port_range
    free = hi - lo + 1 - len(f.busy_ports)
    shown = ", ".join(map(str, f.busy_ports[:8])) + (" ..." if len(f.busy_ports) > 8 else "")
    busy = f"; busy: {shown}" if f.busy_ports else ""
    if free < f.students:
        return Check("ports", False, f"{free} free in {lo}-{hi} for {f.students} students{busy}",
                     f"stop what holds them (ss -ltnp 'sport = :{f.busy_ports[0] if f.busy_ports else lo}' names it), "
                     "or pick another --port-range (and specdec room --port-base)")
    return Check("ports", True, f"{free} free in {lo}-{hi}{busy}")


def check_disk(f: Facts) -> Check:
    low = [(p, g) for p, g in f.disk_free_gib if g < MIN_DISK_GIB]
    shown = ", ".join(f"{p}: {g:.1f} GiB" for p, g in f.disk_free_gib)
    if low:
        return Check("disk", False, f"{shown} (logs and JIT caches need {MIN_DISK_GIB:g} GiB)",
                     f"free space in {', '.join(p for p, _ in low)}")
    return Check("disk", True, f"{shown} free")


def check_serve(f: Facts) -> Check:
    if f.serve_problem:
        return Check("specdec serve", False, f.serve_problem, "make env (or pip install -e .) installs what it needs")
    return Check("specdec serve", True, "the CPU fallback can run here (torch, fastapi, uvicorn, the tiny zoo)")


def choose_mode(requested: str, f: Facts) -> tuple[str, str]:
    """(mode, why): auto is gpu where a GPU and SGLang are present, as `specdec room --engine auto` decides."""
    if requested != "auto":
        return requested, "asked for"
    if (f.gpu_device or f.gpus) and f.sglang is not None:
        return "gpu", "auto: a GPU and SGLang are present"
    return "cpu", "auto: " + ("SGLang is not installed" if (f.gpu_device or f.gpus) else "no GPU") + \
        ", so specdec room would start specdec serve"


def run_checks(f: Facts, mode: str) -> list[Check]:
    """Every check, each marked required or not for `mode` (gpu or cpu)."""
    gpu = mode == "gpu"
    gpu_checks = [check_gpu(f)] + ([check_memory(f)] if f.gpus else []) + [check_cuda(f), check_sglang(f)]
    if f.sglang is not None:  # without SGLang its pins say nothing more than the sglang check
        gpu_checks += [check_torch_pin(f), check_transformers(f)]
    out = [required(c, gpu) for c in gpu_checks]
    out += [check_fa3(f), check_deep_gemm(f)] if f.sglang is not None or gpu else []
    out += [required(check_serve(f), not gpu)]
    out += check_models(f, mode) + [check_ports(f), check_disk(f)]
    return out


def exit_status(checks: list[Check]) -> int:
    return 1 if any(c.required and not c.ok for c in checks) else 0


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"  {c.status:<4}  {c.name:<{width}}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"        {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)


# ----- reading this machine --------------------------------------------------------------------------
def sglang_import_error(timeout: float) -> str | None:
    """Import SGLang's server arguments in a child process: None, or the last line of what went wrong."""
    try:
        out = subprocess.run([sys.executable, "-c", "import sglang.srt.server_args"], capture_output=True, text=True, check=False,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"the import took longer than {timeout:.0f} s"
    if out.returncode == 0:
        return None
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit status {out.returncode}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class Probe:
    """What gather_facts reads, and what it skips (a test or a quick run leaves the slow parts out)."""

    models: tuple[ModelFacts, ...] = ()
    students: int = 1
    headroom: float = DEFAULT_HEADROOM
    port_range: tuple[int, int] = (30000, 30099)
    serve_problem: str | None = None
    import_timeout: float = 300.0
    disk_paths: tuple[str, ...] = field(default_factory=lambda: (tempfile.gettempdir(),))


def gather_facts(p: Probe) -> Facts:
    """Read this machine: GPUs and driver (nvidia-smi), torch, SGLang and its pins, ports, disk."""
    import_error = None
    sglang = _version("sglang")
    if sglang is not None:
        import_error = sglang_import_error(p.import_timeout)
    torch_version, torch_cuda, cuda_available = torch.__version__, torch.version.cuda, torch.cuda.is_available()
    driver, driver_cuda = gpus_.driver_info()
    lo, hi = p.port_range
    return Facts(
        gpu_device=gpus_.has_gpu_device(), gpus=tuple(gpus_.query_gpus()), driver=driver, driver_cuda=driver_cuda,
        torch=torch_version, torch_cuda=torch_cuda, cuda_available=cuda_available, sglang=sglang,
        sglang_requires=tuple(importlib.metadata.requires("sglang") or ()) if sglang else (),
        sglang_import_error=import_error, transformers=_version("transformers"), fa3=gpus_.fa3_present(),
        deep_gemm=gpus_.module_present("deep_gemm"), models=p.models, students=p.students, headroom=p.headroom,
        port_range=p.port_range, busy_ports=tuple(q for q in range(lo, hi + 1) if not port_free(q)),
        disk_free_gib=tuple((d, shutil.disk_usage(d).free / gpus_.GIB) for d in p.disk_paths if os.path.isdir(d)),
        serve_problem=p.serve_problem)


__all__ = [
    "MODES",
    "TORCH_PINS",
    "Check",
    "Facts",
    "ModelFacts",
    "Probe",
    "choose_mode",
    "exit_status",
    "gather_facts",
    "inspect_model",
    "pinned",
    "render",
    "run_checks",
]
