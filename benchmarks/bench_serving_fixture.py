"""Trim what benchmarks/record_proxy.py recorded of SGLang 0.5.16's benchmark client (sglang.benchmark.serving)
into the test fixture tests/fixtures/sglang/bench_serving_0516_requests.json: for each backend and stream mode,
every request the client sent, in order, with its exact JSON body and headers (Host and Content-Length left out:
they belong to the connection). tests/test_serve_clients.py replays them against specdec serve.

usage: python benchmarks/bench_serving_fixture.py RECORD_DIR   (files RECORD_DIR/<backend>.<stream|no_stream>.jsonl)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sglang" / "bench_serving_0516_requests.json"
CONNECTION = {"host", "content-length"}


def trim(line: dict) -> dict:
    body = line["body"]
    return {"method": line["method"], "path": line["path"],
            "headers": {k: v for k, v in line["headers"].items() if k.lower() not in CONNECTION},
            "body": json.loads(body) if body else None}


def main(record_dir: str) -> None:
    runs: dict = {}
    for f in sorted(Path(record_dir).glob("*.jsonl")):
        backend, mode = f.stem.split(".")
        runs.setdefault(backend, {})[mode] = [trim(json.loads(line)) for line in f.read_text().splitlines()]
    out = {"_source": "requests of `python -m sglang.benchmark.serving` from the sglang 0.5.16 wheel "
                      "(--dataset-name random-ids, the tiny zoo's tokenizer, 2 prompts, --flush-cache), recorded by "
                      "benchmarks/record_proxy.py in front of specdec serve (benchmarks/sglang_bench_client.sh record)",
           "runs": runs}
    FIXTURE.write_text(json.dumps(out, indent=1) + "\n")
    counts = [f"{b}/{m} {len(r)} requests" for b, ms in runs.items() for m, r in ms.items()]
    print(f"wrote {FIXTURE}: " + ", ".join(counts))


if __name__ == "__main__":
    main(sys.argv[1])
