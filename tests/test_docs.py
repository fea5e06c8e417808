"""The measured-results page is generated from the committed results: never edited by hand, never stale."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_results_page_is_regenerated_from_benchmark_results():
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert (ROOT / "docs" / "results.md").read_text() == report.render(), "run `python benchmarks/report.py`"


def test_every_script_and_log_the_docs_cite_exists():
    import re

    for page in ("results.md", "zoo.md"):
        text = (ROOT / "docs" / page).read_text()
        for path in set(re.findall(r"`(benchmarks/[\w/.\-]+\.(?:py|sh|log|json))", text)):
            assert (ROOT / path).is_file(), f"docs/{page} cites {path}, which is missing"
