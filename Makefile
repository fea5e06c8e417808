# The two commands of the README. Everything the project needs is installed here, into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specdec-installed
# A pinned torch: an unpinned one pulls gigabytes of CUDA packages on a CPU machine.
TORCH  ?= torch==2.13.0

.PHONY: demo test test-quick test-full env labs jupyter clean

# Python writes each module's bytecode the first time a process imports it, even where the machine's environment sets
# PYTHONDONTWRITEBYTECODE (the course's machines do): else each of the suite's ~160 processes (servers, kernels, the
# CLI) would compile torch and specdec again, about 1 s of CPU each. Only what is imported gets compiled: byte-compiling
# the whole of .venv up front (compileall) cost 54 s of CPU at every clean set-up, pip's own byte-compiling more.
export PYTHONDONTWRITEBYTECODE :=

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile "$(TORCH)" -e ".[dev]"
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(BIN)/specdec tour

# Three pytest-xdist workers on a 2-core machine: while one waits (a server starting, a kernel's time limit) the
# other two keep both cores busy (2026-11-29, the same tree: 193% of a core against 183% with two workers). A module
# whose tests share a fixture runs on one worker (tests/conftest.py: its pytest_xdist_make_scheduler), and the slow
# tests are handed out first.
XDIST  ?= -n 3 --dist loadgroup

test: $(STAMP)
	MPLBACKEND=Agg $(BIN)/python -m pytest -q $(XDIST)

# The notebooks' demonstrations at full size too (make test runs some timing cells smaller:
# tests/notebook_tools.shrunk): the Lab 2 and Lab 3 lectures, the Lab 2 solution, the room test and the tour's
# test at full size.
test-full: $(STAMP)
	SPECDEC_FULL_NOTEBOOKS=1 MPLBACKEND=Agg $(BIN)/python -m pytest -q $(XDIST)

# The edit loop: everything but the tests marked slow (notebooks run and graded, server processes started, the
# later cases of a matrix: tests/quick.py); `make test` runs those too.
# Two workers: these tests wait for nothing, and a third worker's start (importing and collecting the suite) costs
# more than it overlaps (2026-11-29, taking turns: 84 to 98 s with three, 85 to 91 s with two).
QUICK_XDIST ?= -n 2 --dist loadgroup

test-quick: $(STAMP)
	MPLBACKEND=Agg $(BIN)/python -m pytest -q $(QUICK_XDIST) -m "not slow"

# Regenerate labs/ from solutions/ (never edit labs/ by hand).
labs: $(STAMP)
	$(BIN)/specdec labs

# JupyterLab for the notebooks (not needed by demo or test).
jupyter: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[lab]"
	$(BIN)/jupyter lab

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
