"""The simulated-acceptance oracle (SGLang's SGLANG_SIMULATE_ACC_LEN): each verify step keeps floor or ceil of
L - 1 drafts whatever the target says, so that a model whose drafts never match (random weights) shows what a step
costs and pays at a chosen acceptance. The output is then not the target's, but each step's own token is."""

import json
import subprocess
import sys

import numpy as np
import pytest
import requests
from quick import later

from serve_tools import running_server
from specdec.decoder.adaptive import AdaptiveK
from specdec.decoder.engine import Engine
from specdec.zoo.dummy import random_bundle


@pytest.fixture(scope="module")
def random_tiny():
    """The zoo's shape with random weights: its MTP layer's drafts are (nearly) never the target's."""
    return random_bundle("tiny", ("mtp",))


def accept_length(res) -> float:
    """Tokens per verify step: accepted drafts + 1 over the steps that drafted (the budget's last steps included)."""
    ran = res.accepted >= 0
    return float((res.accepted[ran] + 1).mean())


@pytest.mark.parametrize("length", [2.5, *later(1.0, 3.0, 4.0)])
def test_the_measured_accept_length_is_the_chosen_one(random_tiny, length):
    e = Engine(random_tiny, "mtp", k=3, max_batch=4, cuda_graphs="off", simulate=length)
    res = e.generate([[5, 6, 7, 8]] * 4, 96, stop_at_eos=False)
    assert accept_length(res) == pytest.approx(length, abs=0.15)
    full = res.proposed == 3  # not the last steps of a row, whose budget left room for fewer drafts
    assert set(np.unique(res.accepted[full])) <= {int(length - 1), int(np.ceil(length - 1))}


def test_without_the_oracle_random_drafts_are_not_kept(random_tiny):
    res = Engine(random_tiny, "mtp", k=3, cuda_graphs="off").generate([[5, 6, 7, 8]], 48, stop_at_eos=False)
    assert accept_length(res) < 1.2  # what the oracle is for: a random model's drafts say nothing of the speed


def test_the_tokens_after_the_forced_drafts_are_the_targets(random_tiny):
    """Every emitted token but the forced drafts is the target's greedy choice given what came before: checked by
    plain decoding from each step's prefix."""
    e = Engine(random_tiny, "mtp", k=3, cuda_graphs="off", simulate=2.5)
    res = e.generate([[5, 6, 7, 8]], 24, stop_at_eos=False)
    out, prompt, i = res.tokens[0], [5, 6, 7, 8], 1  # the prefill's first token is the target's
    plain = Engine(random_tiny, "ar", cuda_graphs="off")
    checked = 0
    for a, proposed in zip(res.accepted[:, 0], res.proposed[:, 0]):
        if proposed < 3:  # the budget's last step: what it kept was cut at the budget, not by the oracle
            break
        i += int(a)  # the forced drafts
        assert plain.generate([prompt + out[:i]], 1, stop_at_eos=False).tokens[0] == [out[i]]
        i, checked = i + 1, checked + 1
    assert checked >= 5


def test_with_graphs_and_adaptive_k_the_oracle_holds(random_tiny):
    """Under the EmulatedGraph the forced counts are a graph input; under adaptive k a step of k drafts keeps
    min(k, floor or ceil of L - 1)."""
    e = Engine(random_tiny, "mtp", k=3, cuda_graphs="emulate", min_span=8, simulate=3.0, adaptive=AdaptiveK(3))
    res = e.generate([[5, 6, 7, 8]] * 2, 64, stop_at_eos=False)
    ran = res.accepted >= 0
    assert (res.accepted[ran] == np.minimum(2, res.proposed[ran])).all()


def test_a_simulated_length_out_of_range_is_refused(random_tiny):
    for bad in (0.5, 4.5):
        with pytest.raises(ValueError, match="simulated accept length"):
            Engine(random_tiny, "mtp", k=3, cuda_graphs="off", simulate=bad)
    with pytest.raises(ValueError, match="simulated accept length"):
        Engine(random_tiny, "ar", cuda_graphs="off", simulate=2.0)


def test_the_server_reports_the_simulated_accept_length(random_tiny):
    with running_server(random_tiny, "mtp", k=3, max_batch=4, simulate=2.5) as (url, _):
        metas = [requests.post(f"{url}/generate", json={"input_ids": [5, 6, 7, 8 + i], "sampling_params": {
            "max_new_tokens": 80, "temperature": 0, "ignore_eos": True}}, timeout=60).json()["meta_info"]
                 for i in range(3)]
        info = requests.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]
    for m in metas:
        assert m["spec_accept_length"] == pytest.approx(2.5, abs=0.35)
    assert info["avg_spec_accept_length"] == pytest.approx(2.5, abs=0.2)


def test_decode_with_a_simulated_accept_length():
    r = subprocess.run([sys.executable, "-m", "specdec", "decode", "--random-weights", "tiny", "--method", "mtp",
                        "--k", "3", "--simulate-accept-length", "3", "--max-new-tokens", "40", "--json",
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tau"] == pytest.approx(3.0, abs=0.1)
