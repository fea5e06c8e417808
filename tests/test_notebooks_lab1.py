"""Lab 1's notebooks: committed clean, run without errors, the solution earns full marks and the
untouched lab (solution blocks replaced by stubs, as the lab generator does) runs to the end with zero.
What they print is read from their own variables: the optimal-k cap, the bonus position the planted bug
cannot reach, the sign of the formula's error, the seed-averaged adaptive-k baseline, the guesses."""

import re
from pathlib import Path

import nbformat
import pytest
from notebook_tools import assert_committed_clean, exercise_cells, text_of
from notebook_tools import execute as run_notebook
from notebook_tools import untouched_lab as lab_of

ROOT = Path(__file__).resolve().parents[1]
LECTURE = ROOT / "notebooks" / "01_simulated_loop.ipynb"
SOLUTION = ROOT / "solutions" / "01_simulated_loop.ipynb"
BUDGET_S = 120  # the course's limit per Lab 1 notebook, in CPU seconds (a loaded machine does not change them)
GUESS = re.compile(r"^(my_guess_\w+) = None", re.MULTILINE)  # a predict-first cell: the student sets it
# a measured result typed into prose: a percentage or a speedup such as "12.36x"
TYPED_RESULT = re.compile(r"\d+(\.\d+)?\s?%|\d+(\.\d+)?x\b")
ADAPTIVE = """
    if not lengths:
        return k_fixed
    if lengths[-1] == ks[-1]:
        return min(ks[-1] + 2, 10)
    return 1 if lengths[-1] == 0 else ks[-1]
"""


def execute(nb, cwd):
    return run_notebook(nb, cwd, timeout=BUDGET_S)


def untouched_lab():
    return lab_of(SOLUTION)


def with_guesses(nb, guesses: dict[str, str]):
    """The notebook with some predict-first variables set, as a student would before running on."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = GUESS.sub(lambda m: f"{m.group(1)} = {guesses.get(m.group(1), 'None')}", cell.source)
    return nb


def guesses_in(path: Path) -> list[str]:
    return [m.group(1) for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"
            for m in GUESS.finditer(c.source)]


@pytest.mark.parametrize("path", [LECTURE, SOLUTION], ids=["lecture", "solution"])
def test_committed_without_outputs(path):
    assert_committed_clean(path)


def test_exercise_cells_follow_the_convention():
    assert exercise_cells(SOLUTION, 1) == [f"lab1.q{i}" for i in range(1, 13)]


def test_lecture_states_its_objectives():
    cells = nbformat.read(LECTURE, as_version=4).cells
    objectives = next(c.source for c in cells[:3] if c.cell_type == "markdown" and "**Objectives.**" in c.source)
    assert objectives.count("\n- ") >= 3


@pytest.mark.parametrize("path", [LECTURE, SOLUTION], ids=["lecture", "solution"])
def test_every_figure_has_a_title(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and "plt.subplots" in cell.source:
            assert "title=" in cell.source, cell.source[:80]


@pytest.mark.parametrize("path", [LECTURE, SOLUTION], ids=["lecture", "solution"])
def test_prose_types_no_measured_result(path):
    """Percentages and speedups are printed from the variables after the cell that measures them."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            assert not TYPED_RESULT.search(cell.source), cell.source[:80]


@pytest.mark.parametrize("path", [LECTURE, SOLUTION], ids=["lecture", "solution"])
def test_every_guess_is_printed_next_to_a_measurement(path):
    """Each predict-first variable comes before a cell that prints it, or says that there was none."""
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    names = guesses_in(path)
    assert len(names) >= 3
    for name in names:
        first = next(i for i, src in enumerate(cells) if f"{name} = None" in src)
        later = [src for src in cells[first + 1:] if name in src]
        assert later and "no guess recorded" in later[0], name


def test_guess_cells_stay_outside_the_solution_blocks():
    """They reach the student's lab as they are, and grading never depends on them."""
    lab = untouched_lab()
    for cell in nbformat.read(SOLUTION, as_version=4).cells:
        if GUESS.search(cell.source):
            assert "SOLUTION" not in cell.source
            assert any(c.source == cell.source for c in lab.cells)


@pytest.mark.slow
def test_lecture_runs(tmp_path):
    nb = with_guesses(nbformat.read(LECTURE, as_version=4), {"my_guess_best_k": "7", "my_guess_runs": '"above"'})
    nb, seconds = execute(nb, tmp_path)
    assert seconds < BUDGET_S
    out = text_of(nb)
    assert "p-value" in out
    # the guesses, set or not, next to the measurement
    assert "best k = 8 (3.09x);  your guess: 7" in out
    assert "the formula is above the measurement;  your guess: above" in out
    assert "no guess recorded" in out
    # the optimal-k table searches past optimal_k's default cap, and says where that cap would cut
    assert re.search(r"alpha = 0\.95 .* 40 \(12\.54x\)", out), out
    assert "default search (k <= 32) would return k = 32 (12.36x), its cap, not the optimum k = 40 (12.54x)" in out
    # the planted bug shows where it acts, and the notebook says why not at the bonus position
    assert "the bug is flagged at positions [1, 2, 3]" in out
    assert "Position 4 is the bonus position" in out
    # the formula errs both ways, read from the sweep
    assert "long runs (stickiness 0.97): the formula is above the measurement" in out
    assert "alternating (stickiness 0.0): the formula is below the measurement" in out
    # and where it is below, the gap is outside the measurement's interval whichever alpha the formula is given
    for st in ("0.0", "0.3"):
        assert re.search(rf"stickiness {st}: measured tau .*95% interval .*2 of 2 outside, the formula is pessimistic here", out), out
    assert "16 of them easy" in out  # the prose's "half of the tokens are easy", printed
    # temperature: greedy agreement, then alpha rising toward 1; SGLang's default verify is exact, its thresholds are not
    m = re.search(r"argmaxes agree in ([\d.]+)% .* T = 1: ([\d.]+);  T = 20: ([\d.]+)", out)
    assert m and float(m[1]) / 100 < float(m[2]) < float(m[3]) <= 1, out
    assert "threshold_single 1.00, threshold_acc 1.0: acceptance 0.220, TV(output, p) = 0.000" in out
    tvs = [float(x) for x in re.findall(r"threshold_acc \d\.\d: acceptance [\d.]+, TV\(output, p\) = ([\d.]+)", out)]
    assert len(tvs) == 6 and min(tvs[1:]) > 0.01, out
    # trees: the formula within the Monte Carlo's noise for every shape, the best tree above the chain of as many nodes
    zs = re.findall(r"\d nodes, depth \d: formula [\d.]+, Monte Carlo [\d.]+ ± [\d.]+ \(([+-][\d.]+) s\.e\.\)", out)
    assert len(zs) == 4 and max(abs(float(z)) for z in zs) < 4, out
    assert re.search(r"best tree of 8 over the chain of 8: \+0\.\d{3} accepted drafts per step", out), out
    assert "the tree pays" in out and "the tree does not pay" in out  # width pays while a verified position is cheap
    rules = dict(re.findall(r"^(SpecInfer's rule|bug: [a-z ]+?)\s+chi-square p-value ([\d.e+-]+);", out, re.MULTILINE))
    assert len(rules) == 3 and float(rules.pop("SpecInfer's rule")) >= 1e-3 and max(map(float, rules.values())) < 1e-3, out


@pytest.mark.slow
def test_solution_runs_with_full_marks(tmp_path):
    nb = with_guesses(nbformat.read(SOLUTION, as_version=4), {"my_guess_tau": "1.9"})
    policy = next(c for c in nb.cells if c.source.startswith("seeds, steps"))
    policy.source = re.sub(r"(def my_choose_k\(ks, lengths\):\n).*?\n\n", lambda m: m.group(1) + ADAPTIVE + "\n",
                           policy.source, count=1, flags=re.DOTALL)
    assert ADAPTIVE in policy.source
    nb, seconds = execute(nb, tmp_path)
    assert seconds < BUDGET_S
    out = text_of(nb)
    for i in range(1, 13):
        assert re.search(rf"lab1\.q{i} \[PASS\]", out), f"lab1.q{i} did not pass:\n{out}"
    assert "total: 20 / 20" in out
    m = re.search(r"formula (\d\.\d{4});  yours: (\d\.\d{4})", out)
    assert m and m[1] == m[2], out
    m = re.search(r"chi-square p-value of the emitted token against p: ([\d.]+);", out)
    assert m and float(m[1]) >= 1e-3, out
    # the faulty samplers, tested by sampling: each flagged where the solution says its change acts, and only there
    for name, where in (("A", "[2]"), ("B", "[]"), ("C", "[1, 2]"), ("D", "[3]")):
        answer = where.strip("[]").split(",")[0] or "0"
        assert re.search(rf"sampler {name}: p-values by position .* flagged {re.escape(where)};  your answer: {answer}\n", out), out
    assert "not flagged at any position: ['B'];  your guess: no guess recorded" in out
    assert re.search(r"falling \[0.9, 0.7, 0.5\]: tau \d\.\d{3};  rising .*\nmore tokens per step: falling;  your guess: no guess", out)
    assert re.search(r"tau measured \d\.\d{3} ± \d\.\d{3};.*your guess: 1\.9\n", out), out
    assert "no guess recorded" in out
    assert re.search(r"stickiness 0\.00: .*\(-\d\.\d%, -\d+\.\d s\.e\.\): the formula is below the measurement", out), out
    # the challenge: every fixed k measured, then a policy against the best one over several sequences
    assert len(re.findall(r"^fixed k = \d: \d\.\d{3} ± \d\.\d{3}", out, re.MULTILINE)) == 8
    assert re.search(r"within 2 standard errors of it: k = \[[\d, ]+\]; the formula's k = \d is", out), out
    assert "over 12 sequences of 600 steps" in out
    assert re.search(r"difference \+\d\.\d{3} ± \d\.\d{3}: a clear gain", out), out


@pytest.mark.slow
def test_untouched_lab_runs_to_the_end_with_zero(tmp_path):
    lab = untouched_lab()
    assert "### BEGIN SOLUTION" not in "".join(c.source for c in lab.cells)
    nb, _ = execute(lab, tmp_path)  # raises CellExecutionError if a cell depends on a stub
    out = text_of(nb)
    for i in range(1, 13):
        assert re.search(rf"lab1\.q{i} \[FAIL\] 0/\d+ .*not implemented", out), f"lab1.q{i}:\n{out}"
    assert "total: 0 / 20" in out
    assert out.count("no guess recorded") == len(guesses_in(SOLUTION))
    assert "the same scores: my_choose_k chose what the fixed k" in out
