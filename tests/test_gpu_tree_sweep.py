"""benchmarks/gpu_tree_sweep.py, issue 22's Lab 3 sweep of draft trees (SGLang and `specdec serve`), on the CPU with
--cpu-smoke: `specdec serve` started by the launcher with a tree's flags, swept by the course's benchmark, its numbers
condensed and rendered, every server stopped. SGLang's half needs the GPU node; its launch config is checked here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def sweep_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_tree_sweep

    return gpu_tree_sweep


@pytest.mark.slow  # one `specdec serve` started and swept: about 15 s
def test_the_tree_sweep_runs_against_specdec_serve_on_the_cpu(tmp_path, sweep_module, monkeypatch):
    out = tmp_path / "smoke"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_tree_sweep.py"), "--cpu-smoke", "--shapes", "2,2,4",
                           "--keep-ids", "--out", str(out)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "summary.json").read_text())
    run = res["ours"]["2,2,4"]
    assert (run["server"]["topk"], run["server"]["num_draft_tokens"], run["server"]["num_steps"]) == (2, 4, 2)
    assert set(run["by_concurrency"]) == {"1", "2"} and "sglang" not in res and res["left_running"] == []
    for r in run["by_concurrency"].values():
        assert r["errors"] == 0 and r["output_tok_s"] > 0 and r["output_tokens"] > 0
        assert 1 <= r["accept_length_sglang"] <= 3 and r["spec_verify_ct"] > 0  # at most num_steps + 1 a step
        assert r["step_time_s"] > 0 and r["step_time_s_client"] > 0  # the server's step_time_dict and the client's
    # --keep-ids: every request's prompt (one of the category's, cycled in order) and its 8 output token ids
    from specdec.serving.measure.prompts import prompts

    swept = json.loads((out / "sweep_ours_2-2-4.json").read_text())
    for r in swept["runs"]:
        assert [x["prompt"] for x in r["records"]] == [prompts("code")[i] for i in range(len(r["records"]))] or \
            r["concurrency"] > 1  # at concurrency 2 the records come in the order the requests finished
        assert all(x["prompt"] in prompts("code") and len(x["output_ids"]) == x["completion_tokens"] == 8
                   for x in r["records"]), r["records"]
    # the replay of a server's requests by the Lab 2 decoder (cpu_tree_sglang_text.py --sweeps): on our own CPU
    # server's text at concurrency 1 (fp32, one row at a time) it takes the server's verify steps, request by request
    import cpu_tree_sglang_text

    alone = {**swept, "runs": [r for r in swept["runs"] if r["concurrency"] == 1]}
    (tmp_path / "sweep_ours_2-2-4.json").write_text(json.dumps(alone))
    got = cpu_tree_sglang_text.replay([str(tmp_path / "sweep_ours_2-2-4.json")], "eagle")["2,2,4"]
    assert got["verify_server"] == got["verify_ours_on_server_text"] == got["verify_ours"], got
    assert got["server"] == got["ours"] == got["ours_on_server_text"] and got["requests"] == len(alone["runs"][0]["records"])
    log = (out / "gpu_tree_sweep.log").read_text()
    assert "ours 2,2,4 c=1:" in log and "ours 2,2,4 c=2:" in log and "nothing left of its session" in log
    # where the engine thread's time went, read from our /server_info (loop_seconds)
    assert "ours 2,2,4: engine loop over the sweep, seconds: admit " in log and ", step " in log and ", deliver " in log

    # the parts of several device calls merge into one summary, which the page renders
    other = {"env": res["env"], "settings": res["settings"], "sglang": {"2,2,4": run}, "left_running": []}
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert sweep_module.main(["--merge", str(out / "summary.json"), str(tmp_path / "other.json"),
                              "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert set(merged["ours"]) == set(merged["sglang"]) == {"2,2,4"}
    import page

    monkeypatch.setattr(page, "load", lambda name: merged)
    monkeypatch.setattr(page, "recorded", lambda *paths: "2026-11-27")
    section = sweep_module.render()
    assert "### Draft trees across concurrency" in section and section.count("| 2 | 2 | 4 |") == 2
    assert "best tree" not in section  # no chain was measured: no verdict


def test_shapes_and_launch_configs(sweep_module):
    """Shapes are checked as the decoder checks them; both servers get the same head and the same three numbers,
    SGLang with its step times recorded."""
    assert sweep_module.parse_shapes("3,1,4:4,2,8") == [(3, 1, 4), (4, 2, 8)]
    with pytest.raises(ValueError, match="chain"):
        sweep_module.parse_shapes("3,1,5")
    for shape in sweep_module.SHAPES:
        sg, env = sweep_module.config("sglang", shape, 16)
        ours, _ = sweep_module.config("ours", shape, 16)
        argv = sg.command("0.5.16")
        flags = dict(zip(argv, argv[1:]))
        assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
                flags["--speculative-num-draft-tokens"]) == tuple(map(str, shape))
        assert env == {} and sg.environment() == {"SGLANG_RECORD_STEP_TIME": "1"}  # the launcher's step times
        assert flags["--max-running-requests"] == "16"
        mine = ours.command()
        assert mine[mine.index("--speculative-draft-model-path") + 1] == flags["--speculative-draft-model-path"]
        if shape[1] > 1:
            assert mine[mine.index("--topk") + 1] == str(shape[1]) and mine[mine.index("--k") + 1] == str(shape[0])
        assert mine[mine.index("--num-draft-tokens") + 1 if shape[1] > 1 else mine.index("--k") + 1] == str(
            shape[2] if shape[1] > 1 else shape[0])


def test_the_mtp_layer_and_more_flags_reach_both_servers(sweep_module, monkeypatch):
    """--method mtp: both servers draft with the zoo's MTP layer (SGLang's NEXTN, no draft path: it sits in the
    target's checkpoint; ours `--speculative-algorithm mtp`); --ours-args reach `specdec serve` only."""
    monkeypatch.setattr(sweep_module, "METHOD", "mtp")
    monkeypatch.setattr(sweep_module, "OURS_ARGS", ("--compile", "off"))
    sg, _ = sweep_module.config("sglang", (4, 2, 8), 4)
    ours, _ = sweep_module.config("ours", (4, 2, 8), 4)
    argv, mine = sg.command("0.5.16"), ours.command()
    assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN" and "--speculative-draft-model-path" not in argv
    assert mine[mine.index("--speculative-algorithm") + 1] == "mtp" and "--speculative-draft-model-path" not in mine
    assert mine[-2:] == ["--compile", "off"] and "--compile" not in argv


def test_the_verdict_compares_the_best_tree_with_the_best_chain(sweep_module):
    runs = lambda rate: {"by_concurrency": {"1": {"output_tok_s": rate}}}  # noqa: E731
    data = {"ours": {"3,1,4": runs(100.0), "7,1,8": runs(120.0), "4,4,8": runs(150.0), "5,8,16": runs(90.0)}}
    assert sweep_module.best(data, "ours", "1", chain=True) == ("7,1,8", 120.0)
    assert sweep_module.best(data, "ours", "1", chain=False) == ("4,4,8", 150.0)
    assert sweep_module.best(data, "sglang", "1", chain=False) is None
