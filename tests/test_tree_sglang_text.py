"""SGLang's lower accept length on the zoo's EAGLE head is its text: the Lab 2 decoder, teacher-forced to the text
SGLang wrote (benchmarks/cpu_tree_sglang_text.py), takes SGLang's own number of verify steps."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_tree_sglang_text import SUMMARY, accept_length, sweep_records  # noqa: E402
from sglang_zoo_check import PROMPTS  # noqa: E402


@pytest.fixture(scope="module")
def bundle():
    from specdec.zoo import load_bundle

    return load_bundle("tiny")


@pytest.mark.parametrize("shape", ["7,1,8", "4,2,8"])
def test_on_sglangs_text_the_decoder_takes_sglangs_verify_steps(bundle, shape):
    """Prompt 0, where SGLang's bf16 target left our greedy text at token 6: on its own text our decoder takes
    many fewer steps than SGLang; on SGLang's text, exactly SGLang's."""
    request = json.loads(SUMMARY.read_text())["sglang"][shape]["requests"][0]
    prompt = bundle.tokenizer(PROMPTS[0])["input_ids"]
    steps_shape = tuple(int(x) for x in shape.split(","))
    _, on_text = accept_length(bundle, prompt, request["output_ids"], steps_shape)
    _, own = accept_length(bundle, prompt, None, steps_shape)
    assert on_text == request["spec_verify_ct"]
    assert own < 0.9 * request["spec_verify_ct"]


def test_the_mtp_replay_is_reproduced_from_the_committed_requests(bundle):
    """The MTP layer's replay of SGLang's requests (benchmarks/results/cpu_tree_mtp_text/sglang.json, from the ids in
    gpu_tree_mtp_ids/sweeps.tgz): its pooled figures are its per-request verify steps, and one of its requests,
    decoded again on SGLang's text, takes the verify steps the file says (here SGLang's own)."""
    import tarfile

    results = ROOT / "benchmarks" / "results"
    replay = json.loads((results / "cpu_tree_mtp_text" / "sglang.json").read_text())["shapes"]["31,1,32"]
    with tarfile.open(results / "gpu_tree_mtp_ids" / "sweeps.tgz") as tar:
        records = sweep_records(json.load(tar.extractfile("sweep_sglang_31-1-32.json")))
    tokens = sum(len(r["output_ids"]) for r in records)
    assert replay["verify_server"] == [r["spec_verify_ct"] for r in records]
    assert replay["server"] == pytest.approx(tokens / sum(replay["verify_server"]))
    assert replay["ours_on_server_text"] == pytest.approx(tokens / sum(replay["verify_ours_on_server_text"]))
    # the shortest request whose replay took SGLang's own steps
    i = min((i for i, (a, b) in enumerate(zip(replay["verify_server"], replay["verify_ours_on_server_text"])) if a == b),
            key=lambda i: len(records[i]["output_ids"]) * records[i]["spec_verify_ct"])
    r = records[i]
    prompt = bundle.tokenizer(r["prompt"])["input_ids"]
    assert len(prompt) == r["prompt_tokens"]
    _, steps = accept_length(bundle, prompt, r["output_ids"], (31, 1, 32), "mtp", len(r["output_ids"]))
    assert steps == r["spec_verify_ct"]
