"""Grading a class of Lab 3: thirty-odd notebooks (solutions, labs, broken files) in one `specdec grade
--batch -j 2`, each Lab 3 notebook in seconds (its live cells are skipped), every failure in its own row.
benchmarks/grade_class.py times the same class with an endless loop added, on default limits."""

from __future__ import annotations

import csv
import io
import json
import time

import pytest
from notebook_tools import REPO, a_class, specdec

SOLUTION = REPO / "solutions" / "03_sglang_live.ipynb"
LAB = REPO / "labs" / "03_sglang_live.ipynb"


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("class")
    expected = a_class(SOLUTION, LAB, root / "submissions")
    start = time.monotonic()
    proc = specdec("grade", "--batch", str(root / "submissions"), "--csv", str(root / "scores.csv"),
                   "--json", str(root / "results.json"), "-j", "2")
    seconds = time.monotonic() - start
    rows = {r["notebook"].split("/")[-2]: r for r in csv.DictReader(io.StringIO((root / "scores.csv").read_text()))}
    docs = {d["notebook"].split("/")[-2]: d for d in json.loads((root / "results.json").read_text())}
    return dict(proc=proc, seconds=seconds, expected=expected, rows=rows, docs=docs)


def test_the_class_is_graded_and_the_batch_exits_zero(graded):
    assert graded["proc"].returncode == 0, graded["proc"].stderr[-2000:]
    assert set(graded["rows"]) == set(graded["expected"]) and len(graded["rows"]) >= 29


def test_each_notebook_gets_its_own_score(graded):
    for student, want in graded["expected"].items():
        row = graded["rows"][student]
        if want is None:  # not a notebook: a row that says so
            assert row["status"] == "failed" and row["error"] and row["total"] == "0.00", row
        else:
            assert row["status"] == "graded" and row["error"] == "", row
            if want >= 0:
                assert float(row["total"]) == want, (student, row)


def test_live_cells_are_skipped_and_named(graded):
    out = graded["docs"]["solved0"]["output"]
    assert "Not run while grading" in out and "tagged `live`" in out, out


def test_a_lab3_notebook_grades_in_seconds(graded):
    times = {s: d["execution_time"] for s, d in graded["docs"].items() if graded["expected"][s] is not None}
    print(f"{len(graded['rows'])} notebooks in {graded['seconds']:.1f} s with -j 2; slowest: "
          f"{max(times.values()):.1f} s ({max(times, key=times.get)})")
    assert graded["seconds"] < 300
    assert max(times.values()) < 15, times
