"""Stitch docs/results.md from the sections the measurement scripts render, in topic order.

Each script in benchmarks/ that feeds the page renders its own section from its committed results and logs
(a `render...()` function beside its `main`); this file only orders them under their topics. No number is
typed in here or there: every figure is read from benchmarks/results/ or benchmarks/logs/, and each section's
date from the files it reads (benchmarks/page.py).

usage: python benchmarks/report.py   (rewrites docs/results.md and its figure; tests/test_docs.py checks the page
is what this renders)
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(HERE), str(ROOT)):  # the scripts import each other (and page) by name, and specdec from the repo
    if p not in sys.path:
        sys.path.insert(0, p)

INTRO = """# Measured results

Every number below is read from `benchmarks/results/` and `benchmarks/logs/`, written by the script each section
names. Each section is rendered by that script (its `render` function) and this page is stitched from them, in the
order of the topics below, by `python benchmarks/report.py`. Each section opens with its date (the time its results
recorded, or the day they were committed), the device, the script, its logs and its results. The GPU sections dated
before the MTP layer's retraining (`docs/zoo.md`) measured the layer as first trained.{versions}
"""


def intro() -> str:
    """The page's opening, with the versions of the H200 runs whose results record none of their own."""
    from page import load

    lat, zs = load("latency.json"), load("zoo-small.json")
    py = ((zs or {}).get("corpus") or {}).get("python", "")
    versions = (f"\nThe H200 runs whose results record no versions ran torch {lat['torch']} and Python "
                f"{'.'.join(py.split('.')[:2])} (as `benchmarks/results/latency.json` and\n`benchmarks/results/zoo-small.json` "
                "record for the runs of the same day)." if lat and py else "")
    return INTRO.format(versions=versions)

# (topic, [(script, function), ...]) in the page's order
TOPICS = [
    ("The draft/verify loop against the formulas", [("gpu_bench", "render_oracle"), ("cpu_membound", "render")]),
    ("The Lab 2 decoder: step latency and the bandwidth floor", [("gpu_bench", "render_latency"), ("gpu_floor", "render"),
                                                              ("gpu_fast_path", "render"),
                                                              ("cpu_regional_compile", "render")]),
    ("Where a step's time goes", [("gpu_profile", "render"), ("gpu_profile", "render_attention"),
                                  ("gpu_profile", "render_stable"), ("gpu_profile", "render_rope"),
                                  ("gpu_decode_gap", "render"), ("gpu_pin_configs", "render"), ("gpu_gemv", "render")]),
    ("The zoo end to end", [("gpu_bench", "render_e2e"), ("cpu_bench", "render"), ("gpu_decode_compare", "render_first"),
                            ("gpu_decode_compare", "render_engine")]),
    ("Serving: SGLang and specdec serve", [("sglang_zoo_check", "render"), ("serve_cpu_bench", "render"),
                                           ("gpu_lab3", "render_zoo"), ("gpu_fast_path_sglang", "render_serve"),
                                           ("gpu_serve_8b", "render"), ("gpu_serve_8b", "render_scopes"),
                                           ("gpu_serve_8b", "render_two_process"), ("gpu_compile_start", "render"),
                                           ("gpu_serve_8b", "render_adaptive"), ("gpu_serve_stop", "render"),
                                           ("gpu_admit_cost", "render"), ("gpu_admit_cost", "render_captured"),
                                           ("gpu_serve_scale", "render")]),
    ("Where speculation stops paying", [("gpu_lab3", "render_where")]),
    ("Draft trees", [("gpu_tree_sglang", "render"), ("cpu_tree_sglang_text", "render"),
                     ("cpu_tree_formula", "render"), ("gpu_tree_sweep", "render"),
                     ("cpu_tree_accept", "render"), ("gpu_tree_sweep", "render_deep"),
                     ("gpu_tree_sweep", "render_fewer"), ("gpu_tree_sweep", "render_compiled"), ("gpu_tree_sweep", "render_layers"),
                     ("gpu_tree_sweep", "render_mtp"), ("gpu_tree_sweep", "render_mtp32"), ("gpu_tree_sweep", "render_fixed"), ("cpu_tree_sglang_text", "render_mtp"), ("gpu_tree_sweep", "render_fixed_fp32"), ("gpu_tree_profile", "render_untuned"), ("gpu_tree_sweep", "render_step"),
                     ("gpu_tree_profile", "render")]),
    ("Grading a class", [("grade_class", "render")]),
]
FIGURES = [("gpu_lab3", "plot_where", ROOT / "docs" / "figures" / "where_speculation_pays.png")]


def render() -> str:
    parts = [intro()]
    for topic, sections in TOPICS:
        texts = [getattr(importlib.import_module(script), fn)() for script, fn in sections]
        texts = [t for t in texts if t]
        if texts:
            parts.append(f"## {topic}\n")
            parts += texts
    return "\n".join(parts)


def main() -> int:
    out = ROOT / "docs" / "results.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(render())
    print(f"wrote {out}")
    for script, fn, path in FIGURES:
        if (fig := getattr(importlib.import_module(script), fn)(path)):
            print(f"wrote {fig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
