"""benchmarks/gpu_pin_configs.py's procedure on the CPU, its `specdec decode` starts stood in for: N unpinned compiles
each from an empty cache, the fastest one's tile sizes pinned, then starts from empty caches that read them."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_pin_configs  # noqa: E402

from specdec.decoder import compile_cache  # noqa: E402

TPOT = {1: 4.58, 2: 4.34, 3: 4.51}  # three compiles of one step, as two calls on an H200 measured (ms a token)


def test_the_fastest_compiles_tile_sizes_are_pinned_and_the_later_starts_read_them(tmp_path):
    seen = []

    def decode(shape, plan, prompt, flags, env, timeout):
        """A start: tunes (unpinned) or reads the pinned file, in its own empty cache under SPECDEC_COMPILE_DIR."""
        root, pinned = Path(env[compile_cache.CACHE_ENV]), env.get(compile_cache.TUNED_ENV) != "off"
        assert not any(root.iterdir()), "a start began with a cache that was not empty"
        folder = root / "NVIDIA_H200-model"
        i = len(seen) + 1
        if pinned:  # what use_cache does: install the committed file, then compile reading it
            doc = json.loads((tmp_path / "tuned" / compile_cache.tuned_name("NVIDIA H200", "2.11", "3.6.0")).read_text())
            compile_cache.install_tuned(folder, doc["configs"])
            block = json.loads((folder / "ab" / "k.best_config").read_text())["XBLOCK"]
        else:
            block = 16 * i
            (folder / "ab").mkdir(parents=True)
            (folder / "ab" / "k.best_config").write_text(json.dumps({"XBLOCK": block, "time_taken_ms": 900}))
        seen.append((pinned, block))
        return {"tpot_ms": TPOT[i] if not pinned else {32: 4.34}.get(block, 9.9), "compile_s": 80}

    out = tmp_path / "out"
    assert gpu_pin_configs.main(["--compiles", "3", "--checks", "2", "--out", str(out), "--tuned-dir",
                                 str(tmp_path / "tuned"), "--smoke"], decode=decode,
                                kind=lambda: ("NVIDIA H200", "2.11", "3.6.0")) == 0
    assert seen == [(False, 16), (False, 32), (False, 48), (True, 32), (True, 32)]  # start 2 was the fastest
    name = compile_cache.tuned_name("NVIDIA H200", "2.11", "3.6.0")
    doc = json.loads((out / name).read_text())
    assert doc["configs"] == {"ab/k.best_config": {"XBLOCK": 32}} and doc["shapes"]["tiny"]["from_start"] == 2
    assert (tmp_path / "tuned" / name).read_text() == (out / name).read_text()
    res = json.loads((out / "pin.json").read_text())
    assert [e["phase"] for e in res["runs"]] == ["unpinned"] * 3 + ["pinned"] * 2
    assert all(e["tpot_ms"] == 4.34 for e in res["runs"][3:])
    log = (out / "pin.log").read_text()
    assert "pinned 1 tile sizes of unpinned start 2" in log and "pinned: 4.340, 4.340 ms a token" in log

    # another shape pinned on the same GPU kind later: the file keeps this one's tile sizes beside the new ones
    doc["configs"]["cd/other.best_config"] = {"XBLOCK": 8}
    doc["shapes"]["8b"] = {"from_start": 1}
    (tmp_path / "tuned" / name).write_text(json.dumps(doc))
    seen.clear()
    assert gpu_pin_configs.main(["--compiles", "1", "--checks", "0", "--out", str(out), "--tuned-dir",
                                 str(tmp_path / "tuned"), "--smoke"], decode=decode,
                                kind=lambda: ("NVIDIA H200", "2.11", "3.6.0")) == 0
    again = json.loads((tmp_path / "tuned" / name).read_text())
    assert set(again["shapes"]) == {"tiny", "8b"} and again["configs"]["cd/other.best_config"] == {"XBLOCK": 8}
    assert again["configs"]["ab/k.best_config"] == {"XBLOCK": 16}  # this shape's kernel: the new fastest start's


def test_nothing_is_pinned_when_no_start_finished(tmp_path):
    def decode(*a, **k):
        raise RuntimeError("exit status 1: CUDA out of memory")

    out = tmp_path / "out"
    assert gpu_pin_configs.main(["--compiles", "2", "--out", str(out), "--tuned-dir", str(tmp_path / "tuned"),
                                 "--smoke"], decode=decode, kind=lambda: ("NVIDIA H200", "2.11", "3.6.0")) == 1
    assert not (tmp_path / "tuned").exists()
    assert "nothing to pin" in (out / "pin.log").read_text()
    with pytest.raises(SystemExit):
        gpu_pin_configs.main(["--compiles", "0", "--out", str(out)])
