"""`specdec preflight`: is this node ready for the workshop? One line per check, with the fix for each
that fails.

    specdec preflight --models tiny /models/llama-8b --students 12 --port-range 30000-30099
    specdec preflight --mode cpu          # the laptop path: specdec serve

Exit status 0 when the chosen path (gpu: SGLang; cpu: specdec serve) has every check it needs, 1 when
one fails (FAIL), 2 for bad arguments. Checks the path does not need are reported as warn.
"""

from __future__ import annotations

import argparse
import re
import tempfile

from specdec.cli.common import UsageError
from specdec.serving.ops.gpu import DEFAULT_HEADROOM, module_present
from specdec.serving.ops.lifecycle import run_dir
from specdec.serving.ops.preflight import (
    MODES,
    ModelFacts,
    Probe,
    choose_mode,
    exit_status,
    gather_facts,
    inspect_model,
    render,
    run_checks,
)
from specdec.zoo import ModelNotFound, ZooError, resolve, zoo_parts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["tiny"], metavar="MODEL",
                   help="zoo names or model directories the class will serve (default: tiny)")
    p.add_argument("--students", type=int, default=1,
                   help="servers to plan for: memory and ports (default 1; 2N for `specdec room --algorithm none,NEXTN`)")
    p.add_argument("--port-range", default="30000-30099", metavar="A-B", help="ports the servers may take")
    p.add_argument("--mode", choices=MODES, default="auto",
                   help="gpu: SGLang; cpu: specdec serve; auto: gpu where a GPU and SGLang are present")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                   help=f"share of free GPU memory left unplanned (default {DEFAULT_HEADROOM:g}, as specdec room)")
    p.add_argument("--import-timeout", type=float, default=300.0, metavar="S",
                   help="seconds for SGLang's server to import (its first import on a node is slow)")


def port_range(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]) <= 65535:
        raise UsageError(f"--port-range takes A-B with 1 <= A <= B <= 65535, got {text!r}")
    return int(m[1]), int(m[2])


def model_facts(spec: str) -> ModelFacts:
    """A zoo name (every part checked) or a directory."""
    try:
        parts = resolve(spec)
    except ModelNotFound as exc:
        return ModelFacts(spec, problem=str(exc))
    return inspect_model(spec, parts["target"]) if isinstance(parts, dict) else inspect_model(spec)


def serve_problem() -> str | None:
    """Why `specdec serve` cannot run here, or None."""
    missing = [m for m in ("fastapi", "uvicorn") if not module_present(m)]
    if missing:
        return f"{', '.join(missing)} not installed"
    try:
        zoo_parts("tiny")
    except ZooError as exc:
        return str(exc)
    return None


def main(args: argparse.Namespace) -> int:
    if args.students < 1:
        raise UsageError(f"--students must be >= 1, got {args.students}")
    if not 0 < args.headroom < 1:
        raise UsageError(f"--headroom must be in (0, 1), got {args.headroom}")
    probe = Probe(models=tuple(model_facts(m) for m in args.models), students=args.students, headroom=args.headroom,
                  port_range=port_range(args.port_range), serve_problem=serve_problem(), import_timeout=args.import_timeout,
                  disk_paths=(tempfile.gettempdir(), str(run_dir())))  # JIT caches; the servers' logs
    facts = gather_facts(probe)
    mode, why = choose_mode(args.mode, facts)
    print(f"specdec preflight: {mode} path ({why}); {args.students} student(s), ports {args.port_range}", flush=True)
    checks = run_checks(facts, mode)
    print(render(checks))
    failed = [c.name for c in checks if c.required and not c.ok]
    if failed:
        print(f"not ready for the {mode} path: {len(failed)} check(s) failed: {', '.join(failed)}")
    else:
        warned = sum(not c.ok for c in checks)
        print(f"ready for the {mode} path" + (f" ({warned} warning(s) above)" if warned else ""))
    return exit_status(checks)
