"""`specdec sim` and `specdec tour` through the real command line."""

import json
import subprocess
import sys

import pytest

from specdec.sim import formulas


def specdec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, timeout=120)


def test_formula_json():
    r = specdec("sim", "--alpha", "0.8", "--k", "4", "--c", "0.05", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # exactly one JSON object on stdout
    assert out["alpha"] == 0.8 and out["k"] == 4 and out["c"] == 0.05 and out["k_max"] == 32
    assert out["expected_tokens_per_step"] == pytest.approx(3.3616)  # 1 + .8 + .64 + .512 + .4096
    assert out["walltime_improvement"] == pytest.approx(3.3616 / 1.2)
    assert (out["optimal_k"], out["optimal_walltime_improvement"]) == formulas.optimal_k(0.8, 0.05, 32)


def test_formula_limits_and_k_max():
    out = json.loads(specdec("sim", "--alpha", "1", "--k", "5", "--json").stdout)
    assert out["expected_tokens_per_step"] == 6.0 and out["optimal_k"] == 32  # c = 0 by default
    out = json.loads(specdec("sim", "--alpha", "1", "--k", "5", "--k-max", "7", "--json").stdout)
    assert out["optimal_k"] == 7 and out["optimal_walltime_improvement"] == 8.0


def test_formula_table():
    r = specdec("sim", "--alpha", "0.2", "--k", "3")
    assert r.returncode == 0 and "1.2480" in r.stdout and "optimal k" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--alpha", "1.5"],
        ["--alpha", "-0.1"],
        ["--alpha", "nan"],
        ["--alpha", "0.5", "--k", "0"],
        ["--alpha", "0.5", "--c", "-1"],
        ["--alpha", "0.5", "--k-max", "0"],
        ["--alpha", "abc"],
        [],  # no --alpha and no --monte-carlo
        ["--monte-carlo", "--vocab", "5"],
        ["--monte-carlo", "--stickiness", "1"],
        ["--monte-carlo", "--steps", "0"],
        ["--monte-carlo", "--iid"],  # needs --alpha
    ],
)
def test_bad_arguments_exit_nonzero_with_one_line(args):
    r = specdec("sim", *args)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_monte_carlo_json():
    r = specdec("sim", "--monte-carlo", "--k", "3", "--steps", "100", "--sequences", "20", "--seed", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["steps"] == 2000 and out["k"] == 3 and len(out["histogram"]) == 4 and sum(out["histogram"]) == 2000
    assert out["tau_measured"] == pytest.approx(1 + sum(out["by_position"]))
    assert out["tau_from_alpha_text"] == pytest.approx(formulas.expected_tokens_per_step(out["alpha_text"], 3))
    again = json.loads(specdec("sim", "--monte-carlo", "--k", "3", "--steps", "100", "--sequences", "20",
                               "--seed", "1", "--json").stdout)
    assert again == out  # seeded


def test_monte_carlo_iid_and_greedy_tables():
    r = specdec("sim", "--monte-carlo", "--iid", "--alpha", "0.7", "--k", "4", "--steps", "500")
    assert r.returncode == 0 and "tau measured" in r.stdout and "position" in r.stdout
    r = specdec("sim", "--monte-carlo", "--greedy", "--steps", "50", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["mode"] == "greedy"


def test_sim_and_lab1_checks_do_not_import_torch():
    code = "import sys, specdec.cli.sim, specdec.grading.lab1; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_tour_lab1_writes_report_and_plots(tmp_path):
    from specdec.cli.tour import tour_lab1

    report = tour_lab1(tmp_path)
    assert "optimal k" in report and "p-value" in report and "Monte Carlo" in report
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == [
        "lab1_accepted_histogram.png",
        "lab1_montecarlo_vs_formula.png",
        "lab1_speedup_vs_k.png",
        "lab1_tokens_per_step_vs_k.png",
    ]
    assert all((tmp_path / name).stat().st_size > 10_000 for name in pngs)
