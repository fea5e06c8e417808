"""`specdec tour`: both labs' sections print and their plots are written."""

import argparse
import os
import re

from specdec.cli import main as cli
from specdec.cli import tour, tour_lab2

LAB1_PLOTS = ["lab1_tokens_per_step_vs_k.png", "lab1_speedup_vs_k.png", "lab1_accepted_histogram.png",
              "lab1_montecarlo_vs_formula.png"]
LAB2_PLOTS = ["lab2_tau_and_speedup.png"]


def test_tour_prints_both_labs_and_writes_plots(tmp_path, monkeypatch, capsys):
    # in this process (not a `specdec tour` of its own: 1.5 s importing torch again), its timings made smaller as
    # tests/notebook_tools.shrunk makes a lecture's: what the test checks is what each section prints and draws, not
    # how fast. `make demo` runs the tour at full size, and so does `make test-full` (SPECDEC_FULL_NOTEBOOKS=1).
    if os.environ.get("SPECDEC_FULL_NOTEBOOKS") != "1":
        monkeypatch.setattr(tour_lab2, "REPEATS", 2)  # the median of 2 runs of each method, not 5
        monkeypatch.setattr(tour_lab2, "MEMORY_BOUND_TOKENS", 32)  # 32 tokens once, as the Lab 2 lecture's test
        monkeypatch.setattr(tour_lab2, "MEMORY_BOUND_REPEATS", 1)
    out = tmp_path / "tour"
    assert cli(["tour", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "== Lab 1" in stdout and "== Lab 2" in stdout
    for name in LAB1_PLOTS + LAB2_PLOTS:
        f = out / name
        assert f.is_file() and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    lab2 = stdout[stdout.index("== Lab 2"):]
    rows = {m: line for m in ("plain", "MTP layer", "MTP heads", "draft model", "EAGLE head", "n-gram")
            for line in lab2.splitlines() if line.startswith(f"| {m} ")}
    assert len(rows) == 6, lab2
    assert all(line.rstrip(" |").endswith("yes") for line in rows.values()), lab2  # every output equals plain
    tau = float(rows["MTP layer"].split("|")[2])
    assert 1.0 < tau <= 5.0  # k = 4: between 1 and k + 1 tokens per step
    assert re.search(r"\d+\.\d\dx", rows["EAGLE head"])  # a measured speedup
    speedups = [float(re.search(r"(\d+\.\d\d)x", rows[m]).group(1)) for m in rows if m != "plain"]
    # the reason is printed exactly when speculation lost somewhere, with the measured step costs
    zoo = lab2[:lab2.index("== Lab 2 on a target too big")]
    assert ("why" in zoo and "plain steps on this CPU" in zoo) == any(s < 1 for s in speedups), lab2
    assert "load average" in lab2 and "thread(s)" in lab2
    # then the oracle on a target too big for the caches: measured beside Lab 1's prediction, lossless
    bound = lab2[lab2.index("== Lab 2 on a target too big"):]
    m = re.search(r"speedup measured (\d+\.\d\d)x, predicted (\d+\.\d\d)x", bound)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, bound
    assert "same tokens as plain: yes" in bound and "plain steps" in bound, bound


def test_tour_can_skip_the_memory_bound_run():
    parser = argparse.ArgumentParser()
    tour.add_arguments(parser)
    assert parser.parse_args(["--no-memory-bound"]).no_memory_bound and not parser.parse_args([]).no_memory_bound
