"""SGLang's lower accept length on the zoo's EAGLE head is its text: the Lab 2 decoder, teacher-forced to the text
SGLang wrote (benchmarks/cpu_tree_sglang_text.py), takes SGLang's own number of verify steps."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_tree_sglang_text import SUMMARY, accept_length  # noqa: E402
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
