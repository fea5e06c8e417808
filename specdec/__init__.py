"""specdec: an open course on speculative decoding and multi-token prediction.

Every name the notebooks use comes from here: `from specdec import Engine, KVCache, greedy_accept`.
Each is imported when first asked for, so `import specdec` stays light (no torch for Lab 1, no
server for Lab 2); where it lives is in `_WHERE`, by lab.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_WHERE: dict[str, str] = {
    # Lab 1: the draft/verify loop, simulated (numpy): modules of formulas, Monte Carlo and the verify rules
    # (one candidate per position or several), and draft trees
    "formulas": "specdec.sim:formulas",
    "montecarlo": "specdec.sim:montecarlo",
    "verify": "specdec.sim:verify",
    "chi_square_test": "specdec.sim.stats:chi_square_test",
    "DraftTree": "specdec.sim.tree:DraftTree",
    "tree_speedup": "specdec.sim.tree:tree_speedup",
    "tree_pays": "specdec.sim.tree:tree_pays",
    # Lab 2: the decoder (torch)
    "Engine": "specdec.decoder.engine:Engine",
    "SamplingParams": "specdec.decoder.params:SamplingParams",
    "make_proposer": "specdec.decoder.engine:make_proposer",
    "KVCache": "specdec.decoder.kv_cache:KVCache",
    "Proposer": "specdec.decoder.proposers:Proposer",
    "OracleProposer": "specdec.decoder.proposers:OracleProposer",
    "accept": "specdec.decoder.verify:accept",
    "greedy_accept": "specdec.decoder.verify:greedy_accept",
    # ... draft trees (topk > 1): the shape, the drafts, the mask, the greedy walk
    "TreeShape": "specdec.decoder.params:TreeShape",
    "TreeDrafts": "specdec.decoder.tree:TreeDrafts",
    "tree_mask": "specdec.decoder.tree:tree_mask",
    "tree_greedy_accept": "specdec.decoder.verify:tree_greedy_accept",
    "TreeRecorder": "specdec.decoder.tree_accept:TreeRecorder",
    "DepthAcceptance": "specdec.decoder.tree_accept:DepthAcceptance",
    "GraphedStep": "specdec.decoder.cuda_graphs:GraphedStep",
    "EmulatedGraph": "specdec.decoder.cuda_graphs:EmulatedGraph",
    "memory_bound_run": "specdec.decoder.roofline:memory_bound_run",
    "oracle_run": "specdec.decoder.roofline:oracle_run",
    "MTPLayer": "specdec.decoder.draft_modules:MTPLayer",
    "soft_ce": "specdec.decoder.draft_modules:soft_ce",
    "chained_soft_ce": "specdec.decoder.draft_modules:chained_soft_ce",
    "mtp_unrolled": "specdec.zoo.train:mtp_unrolled",
    "chain_acceptance": "specdec.zoo.train:chain_acceptance",
    "load_bundle": "specdec.zoo:load_bundle",
    "build_corpus": "specdec.zoo.corpus:build_corpus",
    "grounded_prompts": "specdec.zoo.corpus:grounded_prompts",
    # Lab 3: live servers, measured
    "records": "specdec.serving.measure:records",
    "SweepConfig": "specdec.serving.measure.bench:SweepConfig",
    "run_sweep": "specdec.serving.measure.bench:run_sweep",
    "prompts": "specdec.serving.measure.prompts:prompts",
    "compare": "specdec.serving.measure.compare:compare",
    "format_comparison": "specdec.serving.measure.compare:format_comparison",
    "crossovers": "specdec.serving.measure.compare:crossovers",
    "LaunchConfig": "specdec.serving.ops.launch:LaunchConfig",
    "LaunchConfigError": "specdec.serving.ops.launch:LaunchConfigError",
    "detect_backend": "specdec.serving.ops.launch:detect_backend",
    "lab_servers": "specdec.serving.ops.room:lab_servers",
    "pid_alive": "specdec.serving.ops.lifecycle:pid_alive",
    "zoo_parts": "specdec.zoo:zoo_parts",
    # every lab: the exercises
    "check": "specdec.grading:check",
    "exercises_for_lab": "specdec.grading:exercises_for_lab",
}

__all__ = ["__version__", *_WHERE]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    module, attr = _WHERE[name].split(":")
    found = importlib.import_module(module)
    # a module of a package (specdec.sim's formulas) is an attribute only once it has been imported
    value = getattr(found, attr) if hasattr(found, attr) else importlib.import_module(f"{module}.{attr}")
    globals()[name] = value  # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
