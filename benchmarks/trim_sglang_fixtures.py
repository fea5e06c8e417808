"""Trim the responses that benchmarks/gpu_lab3.py recorded from real SGLang 0.5.16 (tiny zoo, H200) into
the test fixture tests/fixtures/sglang/real_0516_zoo.json: every field SGLang sent in a request's
answer is kept; /server_info keeps the fields the client reads; /metrics keeps the sglang: series.
Also writes specdec/grading/sglang_0516_metas.json, the real meta_infos Lab 3's checks grade on.

usage: python benchmarks/trim_sglang_fixtures.py benchmarks/results/gpu_lab3/zoo
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

INFO_KEYS = ("version", "status", "model_path", "speculative_algorithm", "speculative_draft_model_path",
             "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "max_running_requests",
             "max_total_num_tokens", "chat_template")
STATE_KEYS = ("avg_spec_accept_length", "last_gen_throughput", "memory_usage", "effective_max_running_requests_per_dp",
              "max_speculative_num_draft_tokens", "step_time_dict")
METRICS = ("sglang:spec_", "sglang:generation_tokens_total", "sglang:num_running_reqs", "sglang:prompt_tokens_total")


def trim_info(info: dict) -> dict:
    out = {k: info.get(k) for k in INFO_KEYS}
    out["internal_states"] = [{k: s[k] for k in STATE_KEYS if k in s} for s in info.get("internal_states", [])]
    return out


def trim_metrics(text: str) -> str:
    keep = [line for line in text.splitlines() if any(m in line for m in METRICS)]
    return "\n".join(keep) + "\n"


def main(folder: str) -> int:
    src = Path(folder)
    raw = {}
    with tarfile.open(src / "fixtures.tgz") as tar:
        for m in tar.getmembers():
            if m.isfile():
                raw[Path(m.name).name] = tar.extractfile(m).read().decode()
    summary = json.loads((src / "summary.json").read_text())
    env = json.loads((src / "env.json").read_text())
    out = {"_source": ("real responses of SGLang 0.5.16 serving the tiny zoo on an H200 (benchmarks/gpu_lab3.py zoo, "
                       "2026-11-23; log benchmarks/logs/gpu_lab3_zoo.log), trimmed by benchmarks/trim_sglang_fixtures.py"),
           "env": {k: env.get(k) for k in ("nvidia_smi", "torch", "sglang", "transformers")}, "servers": {}}
    for name in ("plain", "nextn", "eagle"):
        rec = json.loads(raw[f"{name}.json"])
        server = {k: rec[k] for k in ("generate", "generate_stream", "completions", "completions_stream", "chat_stream")}
        server["server_info"] = trim_info(rec["server_info"]["response"])
        server["metrics"] = trim_metrics(raw[f"{name}_metrics.txt"])
        server["check_prompts"] = [{k: v for k, v in r.items() if k != "output_ids"}
                                   for r in summary["modes"][name]["requests"]]
        out["servers"][name] = server
    chat = src.parent / "chat" / "chat.json"
    if chat.is_file():  # the zoo with its chat template, recorded later (benchmarks/gpu_lab3.py chat)
        rec = json.loads(chat.read_text())
        out["servers"]["nextn"]["chat_with_template"] = {k: rec[k] for k in ("chat", "chat_stream")}
    root = Path(__file__).resolve().parents[1]
    dest = root / "tests" / "fixtures" / "sglang" / "real_0516_zoo.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest} ({dest.stat().st_size} bytes)")
    write_grading_metas(out["servers"], root / "specdec" / "grading" / "sglang_0516_metas.json")
    return 0


def write_grading_metas(servers: dict, dest: Path) -> None:
    """The speculative servers' answers (the fixture request and the four check prompts) and one plain answer,
    each meta_info cut to the counters and the request's own fields."""
    metas = []
    for name in ("nextn", "eagle"):
        metas.append(servers[name]["generate"]["response"]["meta_info"])
        metas += [{k: v for k, v in r.items() if k != "prompt"} for r in servers[name]["check_prompts"]]
    metas.append(servers["plain"]["generate"]["response"]["meta_info"])
    keep = ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency")
    doc = {"_source": "meta_info of real /generate answers: SGLang 0.5.16, tiny zoo, H200, NEXTN and EAGLE (3 steps, "
                      "topk 1) and plain; tests/fixtures/sglang/real_0516_zoo.json (benchmarks/gpu_lab3.py)",
           "metas": [{k: v for k, v in m.items() if k in keep or k.startswith("spec_")} for m in metas]}
    dest.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {dest} ({len(metas)} answers)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
