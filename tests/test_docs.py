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

    for page in ("results.md", "zoo.md", "instructor-guide.md"):
        text = (ROOT / "docs" / page).read_text()
        for path in set(re.findall(r"`(benchmarks/[\w/.\-]+\.(?:py|sh|log|json|tgz))", text)):
            assert (ROOT / path).is_file(), f"docs/{page} cites {path}, which is missing"
        for path in set(re.findall(r"`(benchmarks/[\w/.\-]+/)`", text)):
            assert (ROOT / path).is_dir(), f"docs/{page} cites {path}, which is missing"


def test_each_results_section_says_when_on_what_by_which_script_and_log():
    """docs/results.md is organised by topic (##), each measurement a section (###) that opens with its
    date, its device, the script that measures it and its log; no issue numbers, no section numbers."""
    import re

    text = (ROOT / "docs" / "results.md").read_text()
    sections = re.split(r"^### ", text, flags=re.MULTILINE)[1:]
    assert len(sections) >= 10 and len(re.findall(r"^## ", text, flags=re.MULTILINE)) >= 5
    for s in sections:
        heading, _, body = s.partition("\n")
        first = body.strip().splitlines()[0]
        assert re.match(r"\*Measured \d{4}-\d\d-\d\d( to \d{4}-\d\d-\d\d)? on .+; script `benchmarks/[\w.]+\.py", first), heading
        assert re.search(r"; logs? `benchmarks/logs/", first), heading
        assert not re.match(r"\d", heading), heading
    assert not re.search(r"\bissue \d", text)
    assert not re.search(r"\bsections? \d", text)


def test_the_one_off_run_scripts_stay_gone():
    """Each measurement has one script that renders its section; wrappers that ran them once are not kept."""
    bench = ROOT / "benchmarks"
    assert not list(bench.glob("gpu_run_*.sh")) and not (bench / "gpu_check_engine.sh").exists()
    assert "issue" not in (bench / "report.py").read_text().lower()


GUIDE = ROOT / "docs" / "instructor-guide.md"


def test_the_guide_lists_every_exercise_with_its_points():
    import re

    from specdec.grading import lab1, lab2, lab3

    text = GUIDE.read_text()
    rows = dict(re.findall(r"^\| (lab\d\.q\d+) \| (\d+) \|", text, re.MULTILINE))
    graded = {q.id: str(q.points) for lab in (lab1, lab2, lab3) for q in lab.EXERCISES}
    assert rows == graded
    for n, lab in ((1, lab1), (2, lab2), (3, lab3)):
        assert f"Lab {n}: " in text and f"({sum(q.points for q in lab.EXERCISES)} points)" in text


def test_the_guide_names_only_real_verbs_and_the_pins_preflight_checks():
    import re
    import subprocess

    from specdec.cli import COMMANDS
    from specdec.serving.ops.preflight import TORCH_PINS, TRANSFORMERS_PINS

    text = GUIDE.read_text()
    assert set(re.findall(r"`specdec (\w+)", text)) <= set(COMMANDS)
    table = {}
    for first, last, torch in re.findall(r"^\| (0\.5\.\d+)(?: to (0\.5\.\d+))? \| (\d+\.\d+\.\d+) \|$", text, re.MULTILINE):
        table[(first, last or first)] = torch
    assert table == {(".".join(map(str, lo)), ".".join(map(str, hi))): torch for (lo, hi), torch in TORCH_PINS.items()}
    packages = (ROOT / "tools" / "sglang-offline" / "packages.txt").read_text()
    assert "sglang==0.5.16" in packages and f"transformers=={TRANSFORMERS_PINS[(0, 5, 16)]}" in packages
    for script in ("build.sh", "setup.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / "tools" / "sglang-offline" / script)], check=False).returncode == 0
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_room.sh")], check=False).returncode == 0


def test_what_the_guide_quotes_from_the_logs_is_in_them():
    import re

    text = GUIDE.read_text()
    log = (ROOT / "benchmarks" / "logs" / "sglang_zoo.log").read_text()
    section = text[text.index("Lines that look like errors"):text.index("## 9.")]
    quotes = re.findall(r"`([^`]+)`", section)[1:]  # the first is the log's name
    quotes += ["K size: 20.82 GB, V size: 20.82 GB", "elapsed=39.35 s", "elapsed=1.41 s", "mem usage=0.02 GB",
               "max_prefill_tokens=16384"]
    assert len(quotes) >= 9
    for q in quotes:
        assert q in log, q
        assert q.split("=")[0] in text
    results = (ROOT / "docs" / "results.md").read_text()
    assert "| plain | - | 79.10 |" in results and "79.1 s" in text


def test_code_cites_documents_by_heading():
    """A section number moves when a page is reorganised; a heading is found by searching for it."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    results = (root / "docs" / "results.md").read_text()
    for path in (root / "specdec").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"\.md, section \d", text), f"{path}: cite the section's heading"
        for heading in re.findall(r'results\.md, the\s+(?:#\s*)?section\s+(?:#\s*)?"([^"]+)"', text):
            assert heading in results, f"{path}: no section {heading!r} in docs/results.md"


def test_pages_cite_the_results_page_by_heading():
    import re

    for path in (ROOT / "README.md", *(ROOT / "docs").glob("*.md")):
        text = path.read_text()
        assert not re.search(r"results\.md`?,? \(?sections? \d", text), f"{path}: cite the results section's heading"


def test_notebooks_cite_the_results_page_by_heading():
    """The notebooks quote a results section by its heading (in italics, or in quotes in code), and it exists."""
    import json
    import re

    results = (ROOT / "docs" / "results.md").read_text()
    headings = {h.strip() for h in re.findall(r"^#+ (.+)$", results, flags=re.M)}
    cited = 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            text = " ".join("".join(cell["source"]).split())  # one line: a citation may wrap
            assert not re.search(r"results\.md`?,?\)? \(?sections? \d", text), f"{path.name}: cite the heading"
            for m in re.finditer(r"results\.md`?,? (?:\(|the section )?(.{0,200})", text):
                for h in re.findall(r'\*([^*]+)\*|"([^"]+)"', m.group(1)):
                    h = h[0] or h[1]
                    if h[:1].isupper() and len(h) > 15:
                        assert h in headings, f"{path.name}: no section {h!r} in docs/results.md"
                        cited += 1
    assert cited >= 5  # the parser sees the citations it is meant to check


def test_the_rehearsal_the_guide_reports_is_in_its_log():
    """Section 10's figures are the committed log's: each notebook's time, grade and the servers' start."""
    text = GUIDE.read_text()
    section = text[text.index("## 10."):]
    log = (ROOT / "benchmarks" / "logs" / "gpu_notebooks.log").read_text()
    for line in ("== execute notebooks/02_static_k_mtp.ipynb: rc=0 in 80 s", "== execute solutions/02_static_k_mtp.ipynb: rc=0 in 29 s",
                 "== execute labs/02_static_k_mtp.ipynb: rc=0 in 27 s", "both servers answer after 74.2 s",
                 "== execute solutions/03_sglang_live.ipynb: rc=0 in 179 s", "03_sglang_live.short.ipynb: rc=0 in 262 s",
                 "grade_lab3.json: 03_sglang_live.ipynb 16 / 16", "grade_lab2.json: 02_static_k_mtp.ipynb 19 / 19",
                 "grade_lab1.json: 01_simulated_loop.ipynb 20 / 20", "final loss nan", "illegal memory access",
                 "servers still running: none (of the 2 this notebook started)", "both servers answer after 207.6 s",
                 "== execute solutions/03_sglang_live.ipynb: rc=0 in 307 s",
                 "concurrency 1: plain step 1.48 ms, speculative step 3.96 ms", "both servers answer after 134.6 s",
                 "== execute solutions/03_sglang_live.ipynb: rc=0 in 236 s"):
        assert line in log, line
    together = (ROOT / "benchmarks" / "logs" / "gpu_lab_servers.log").read_text()
    assert "sglang: both servers answer after 105.3 s (started 0.0 s apart); left running: none" in together
    assert "sglang: both servers answer after 142.2 s (started 0.0 s apart); left running: none" in together
    assert "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.3" in together
    for figure in ("80 s", "29 s", "27 s", "74.2 s", "179 s", "262 s", "`16 / 16`", "`19 / 19`", "`20 / 20`", "207.6 s",
                   "307 s", "plain step 1.48 ms, speculative step 3.96 ms", "105.3 s", "142.2 s", "134.6 s", "236 s",
                   "Loaded weights leave no GPU memory for the KV cache"):
        assert figure in section, figure

