"""benchmarks/gpu_profile.py runs only on a GPU; on the CPU, what can rot without one: its arguments are
checked before any work, and each candidate it swaps in is put back afterwards."""

import subprocess
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_profile  # noqa: E402

import specdec.decoder.cuda_graphs as graphs_mod  # noqa: E402
import specdec.decoder.model as model_mod  # noqa: E402
from specdec.decoder.kv_cache import KVCache  # noqa: E402
from specdec.decoder.step import Rows  # noqa: E402


def test_an_unknown_variant_is_refused_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_profile.py"), "--out", str(tmp_path / "p.json"),
                           "--variants", "compile+cdt; realize_opcount 8"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown variant 'realize_opcount 8'" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_every_swap_is_put_back():
    import torch._inductor.config as inductor_config

    saved = (model_mod.DECODE_ROWS, model_mod.Linear.forward, Rows.sampling, dict(graphs_mod.INDUCTOR_OPTIONS),
             torch.nn.functional.linear, inductor_config.coordinate_descent_tuning)
    with gpu_profile.Swap(sdpa=True, cublas=True, sampling_path=True, cdt=True, linear=lambda *a: None,
                          inductor={"realize_opcount_threshold": 8}):
        assert model_mod.DECODE_ROWS == 0 and model_mod.Linear.forward is torch.nn.Linear.forward
        assert graphs_mod.INDUCTOR_OPTIONS == {"coordinate_descent_tuning": True, "realize_opcount_threshold": 8}
        rows = Rows.empty(KVCache(1, 2, 1, 4, 8), 8, 1)
        rows.sampling = False
        assert rows.sampling  # the sampling path, whatever the engine sets
    assert saved == (model_mod.DECODE_ROWS, model_mod.Linear.forward, Rows.sampling, graphs_mod.INDUCTOR_OPTIONS,
                     torch.nn.functional.linear, inductor_config.coordinate_descent_tuning)


def test_an_unknown_part_or_a_compiled_variant_that_is_not_a_plain_step_is_refused(tmp_path):
    for extra, said in ((["--parts", "host,hosts"], "unknown part 'hosts'"),
                        (["--parts", "compiled", "--compiled-variants", "graph"], "'graph' is not one")):
        proc = subprocess.run([sys.executable, str(BENCH / "gpu_profile.py"), "--out", str(tmp_path / "p.json"), *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())
