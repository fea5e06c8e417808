import os
import signal
import tempfile

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may download anything
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# servers the tests launch keep their logs and pid files here, not in the user's ~/.cache
os.environ.setdefault("SPECDEC_RUN_DIR", tempfile.mkdtemp(prefix="specdec-test-servers-"))
# One CPU thread, here and in every process a test starts (servers, kernels, the CLI): the tiny models
# gain nothing from more, and on a busy 2-core machine threads spin against each other (10x slower steps).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
# Ctrl-C as in a terminal, even where the test run was started with SIGINT ignored (a background job, nohup):
# the tests of Ctrl-C rely on it, and the servers and rooms they start inherit it
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_bundle():
    """The shipped zoo in fp32 on the CPU, every part loaded."""
    from specdec.zoo import load_bundle

    return load_bundle("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def code_prompts(tiny_bundle):
    """Four prompts of different lengths (ragged batch)."""
    texts = ["import os\nimport sys\n\ndef main(", "Monday, Tuesday, Wednesday,",
             "class Queue:\n    def __init__(self, maxsize=0):\n        self.", "x = 1\nfor i in range(10):\n    x = x * 2 + i\n"]
    return [tiny_bundle.tokenizer(t)["input_ids"] for t in texts]


@pytest.fixture(scope="session")
def engine(tiny_bundle):
    """engine(method, k=4, cuda_graphs="off") on the tiny zoo, built once per combination."""
    from specdec.decoder.engine import Engine

    built = {}

    def make(method="ar", k=4, cuda_graphs="off"):
        key = (method, k, cuda_graphs)
        if key not in built:
            built[key] = Engine(tiny_bundle, method, k=k, cuda_graphs=cuda_graphs)
        return built[key]

    return make


@pytest.fixture
def inline_plots(monkeypatch):
    """A notebook's kernel draws with Jupyter's inline backend, as for a student (Agg is set above)."""
    monkeypatch.delenv("MPLBACKEND", raising=False)
