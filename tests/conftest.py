import functools
import gc
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may download anything
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# servers the tests launch keep their logs and pid files here, not in the user's ~/.cache; one directory for
# each pytest-xdist worker (a worker inherits the controller's environment): a test that looks for its servers
# (tests/test_notebooks_lab3.py) finds only its own worker's
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["SPECDEC_RUN_DIR"] = tempfile.mkdtemp(prefix=f"specdec-test-servers-{os.environ['PYTEST_XDIST_WORKER']}-")
else:
    os.environ.setdefault("SPECDEC_RUN_DIR", tempfile.mkdtemp(prefix="specdec-test-servers-"))
# One CPU thread, here and in every process a test starts (servers, kernels, the CLI): the tiny models
# gain nothing from more, and on a busy 2-core machine threads spin against each other (10x slower steps).
os.environ["OMP_NUM_THREADS"] = "1"
# Ctrl-C as in a terminal, even where the test run was started with SIGINT ignored (a background job, nohup):
# the tests of Ctrl-C rely on it, and the servers and rooms they start inherit it
signal.signal(signal.SIGINT, signal.default_int_handler)
# pytest keeps each test module's assertion-rewritten code in tests/__pycache__ unless bytecode writing is off, as
# PYTHONDONTWRITEBYTECODE turns it off on the course's machines: then every worker of every run rewrites all of
# them again (about 3 s of each worker's collection). Only this process's writes: what it starts inherits the env.
sys.dont_write_bytecode = False


def pytest_configure(config):
    """torch with one thread where tests run: in each pytest-xdist worker, or in a run without workers. The
    controller of `-n 3` runs none and does not import torch, which it did before starting the workers (1 to
    3 s of every run's start, the first import in a clean clone compiling torch's bytecode)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_bundle():
    """The shipped zoo in fp32 on the CPU, every part loaded."""
    import torch

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


# Lab 3's class (tests/notebook_tools.a_class), graded once per run: tests/test_grade_class.py reads the whole
# class, tests/test_grade_lab3.py the solution, the untouched lab and the planted wrong answers in it.
NOTEBOOK_CPU_S = 15  # a Lab 3 notebook's grading, its live cells skipped: seconds of CPU time
CLASS_CPU_S = 300  # the whole class's, grader and kernels


@pytest.fixture(scope="session")
def lab3_class(tmp_path_factory) -> dict:
    """Thirty-odd Lab 3 notebooks in one `specdec grade --batch -j 2`, each under a total limit of NOTEBOOK_CPU_S:
    {proc, took, expected, planted (exercise id -> student), rows (CSV), docs (JSON)}, keyed by student."""
    import csv
    import io
    import json

    from cpu_clock import timed
    from notebook_tools import REPO, a_class, specdec

    solution, lab = REPO / "solutions" / "03_sglang_live.ipynb", REPO / "labs" / "03_sglang_live.ipynb"
    assert lab.exists(), "run `specdec labs`"
    root, planted = tmp_path_factory.mktemp("class"), {}
    expected = a_class(solution, lab, root / "submissions", planted=planted)
    with timed() as took:
        proc = specdec("grade", "--batch", str(root / "submissions"), "--csv", str(root / "scores.csv"),
                       "--json", str(root / "results.json"), "-j", "2", "--timeout", str(NOTEBOOK_CPU_S))
    rows = {r["notebook"].split("/")[-2]: r for r in csv.DictReader(io.StringIO((root / "scores.csv").read_text()))}
    docs = {d["notebook"].split("/")[-2]: d for d in json.loads((root / "results.json").read_text())}
    return dict(proc=proc, took=took, expected=expected, planted=planted, rows=rows, docs=docs)


@pytest.fixture
def inline_plots(monkeypatch):
    """A notebook's kernel draws with Jupyter's inline backend, as for a student (Agg is set above)."""
    monkeypatch.delenv("MPLBACKEND", raising=False)


# ----- scheduling: `make test` runs the suite on three pytest-xdist workers (-n 3 --dist loadgroup) ---------
# Whole modules marked slow (notebooks executed, notebooks graded, servers started): `make test-quick` leaves
# them out (`-m "not slow"`); single slow tests elsewhere carry @pytest.mark.slow themselves.
SLOW_MODULES = {
    "test_notebooks_lab1", "test_notebooks_lab2", "test_notebooks_lab3",
    "test_grade_class", "test_grade_lab1", "test_grade_lab2", "test_grade_lab3",
    "test_grading", "test_grading_attacks", "test_grading_hostile", "test_grading_load",
    "test_room", "test_launch_signals", "test_launch_gpu_script", "test_gpu_floor", "test_tour",
    "test_decode_cli",  # every test a `specdec decode` process of its own
    "test_serve_two_process",  # `specdec serve` and its engine process, started for the module
}
# ... and single tests of other modules that take more than about 10 s on a 2-core machine, start a server
# process of their own (3 to 5 s each: it imports torch and loads the zoo) or run a benchmark script
SLOW_TESTS = {
    "test_ten_start_stop_cycles_leave_no_process", "test_eval_writes_figures_and_keeps_the_other_keys",
    "test_fuzzed_requests_never_harm_the_server", "test_emulated_graphs_match_eager_for_every_proposer",
    # a server process of their own
    "test_a_stop_signal_drains_and_exits_0", "test_a_dead_engine_exits_the_process_non_zero",
    "test_the_port_in_use_is_a_one_line_error", "test_a_bad_serve_flag_is_named",
    "test_the_cpu_path_is_ready_here_and_a_busy_port_or_a_missing_model_is_not",
    "test_timeout_mid_start_kills_the_server_and_reports_its_log",
    "test_the_engine_process_killed_turns_health_503_and_fails_its_requests", "test_serve_exits_1_when_its_engine_process_dies",
    "test_the_engine_process_exits_when_serve_is_killed", "test_ctrl_c_to_the_process_group_drains_and_stops_both",
    "test_a_missing_model_is_still_one_line_and_status_2", "test_cuda_without_a_gpu_is_still_one_line_and_status_2",
    "test_only_the_engine_process_loads_torch", "test_a_slow_answer_from_the_engine_process_does_not_stall_the_event_loop",
    # a benchmark script
    "test_the_host_step_benchmark_runs_and_records_both_batches",
    "test_an_unknown_part_or_a_compiled_variant_that_is_not_a_plain_step_is_refused",
    "test_an_unknown_variant_is_refused_before_any_work", "test_each_start_is_a_process_and_the_section_reads_the_results",
    # a `specdec` process of its own that loads torch (3 to 5 s of CPU each; tests/test_cli.py keeps the quick ones)
    "test_missing_file_names_it_and_the_rebuild_command", "test_truncated_weights_name_the_file_and_the_rebuild_command",
    "test_corrupted_zoo_json_names_it", "test_bad_arguments_are_one_line", "test_cuda_without_a_gpu_is_one_line",
    "test_tour_lab1_writes_report_and_plots", "test_the_cli_says_compile_on_on_a_cpu_in_one_line_and_writes_nothing_home",
    "test_decode_on_a_cpu_runs_uncompiled_by_default", "test_serve_answers_from_random_weights",
    "test_decode_with_a_simulated_accept_length", "test_decode_with_adaptive_k_keeps_the_output", "test_checks_need_no_model",
    "test_bad_decode_input_is_one_line",
    # waits out a time limit (2.5 s of wall clock, little CPU)
    "test_a_kernel_that_hangs_is_killed_at_its_limit_plus_grace",
    # torch.compile on the CPU (inductor compiles C++: 5 to 20 s each)
    "test_one_row_linear_under_compile_is_the_matmul", "test_a_graph_captured_greedy_is_not_replayed_for_sampling_rows",
    "test_a_compiled_batch1_step_takes_the_fast_paths_and_decodes_as_eager", "test_compile_is_not_cut_off_after_eight_captures",
}
# Modules that read one session fixture: they run on the same worker, so that it is built once.
SHARED_RUNS = {"test_grade_class": "lab3_class", "test_grade_lab3": "lab3_class"}
TESTS = Path(__file__).resolve().parent
WIDER_FIXTURE = re.compile(r"""scope\s*=\s*["'](module|class|package)["']""")


@functools.lru_cache(maxsize=None)
def _shares_fixtures(path: str) -> bool:
    """The module defines a fixture wider than a function (built once for its tests)."""
    try:
        return bool(WIDER_FIXTURE.search((TESTS.parent / path).read_text()))
    except OSError:
        return True


def work_unit(nodeid: str) -> str:
    """What one worker runs as a whole: a module whose tests share a fixture (built once, on that worker), the
    modules of one of SHARED_RUNS, or else one test (the notebooks' tests, each its own run, share out evenly)."""
    path = nodeid.split("::", 1)[0]
    module = Path(path).stem
    if module in SHARED_RUNS:
        return SHARED_RUNS[module]
    return path if _shares_fixtures(path) else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup, by work_unit: pytest-xdist 3.8's own loadgroup reads xdist_group marks through a node
    id that pytest 9 no longer lets it change, so that it sends a group's tests to any worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the order below: the slow tests first
    return WorkUnits(config, log)


def pytest_itemcollected(item):
    if item.module.__name__ in SLOW_MODULES or item.originalname in SLOW_TESTS:
        item.add_marker(pytest.mark.slow)


# The longest work units, in seconds on a quiet 2-core machine (roughly: only their order matters). They are handed
# out first, longest first, so that no worker starts a two-minute notebook while the other has run out of work.
LONGEST = {
    "tests/test_notebooks_lab2.py::test_lecture_runs": 42, "tests/test_grading_attacks.py": 37,
    "tests/test_notebooks_lab3.py::test_lecture_runs": 31, "tests/test_tour.py::test_tour_prints": 9,
    "tests/test_notebooks_lab2.py::test_solution_runs": 21, "tests/test_launch_lifecycle.py::test_ten_start": 19,
    "tests/test_room.py::test_lab_3_runs": 17, "lab3_class": 14, "tests/test_notebooks_lab3.py::test_untouched_lab": 13,
    "tests/test_gpu_floor.py::test_the_floor_benchmark_runs": 11, "tests/test_grading_load.py": 11,
    "tests/test_notebooks_lab2.py::test_untouched_lab": 11, "tests/test_gpu_serve_8b.py": 10,
    "tests/test_cpu_regional_compile.py": 10, "tests/test_gpu_fast_path.py": 9, "tests/test_grading.py": 9,
    "tests/test_grade_lab2.py": 9, "tests/test_zoo.py::test_eval_writes": 6,
    "tests/test_room.py::test_a_room_of_four": 5, "tests/test_gpu_tree_sweep.py::test_the_tree_sweep_runs": 5,
    "tests/test_bench.py": 12,
}


def expected_seconds(nodeid: str) -> float:
    unit = work_unit(nodeid)
    return max((s for prefix, s in LONGEST.items() if unit.startswith(prefix)), default=0.0)


def pytest_collection_modifyitems(config, items):
    # the slow tests first, the longest of them first (longest processing time first: the workers finish close
    # together), the quick ones side by side at the end
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, -expected_seconds(item.nodeid)))


def pytest_collection_finish(session):
    """What collecting imported (torch, transformers, every test module: most of a worker's heap) is kept for the
    whole run: frozen, the garbage collector no longer walks it at each full collection. A full collection of a
    worker's heap took 0.5 to 1.5 s of the wall clock in a loaded run (2026-11-29), long enough to stall a timed
    sweep (tests/test_bench.py), and the workers' collections were 24 s of CPU in all."""
    gc.collect()
    gc.freeze()
