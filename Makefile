# The two commands of the README. Everything the project needs is installed here, into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specdec-installed
# A pinned torch: an unpinned one pulls gigabytes of CUDA packages on a CPU machine.
TORCH  ?= torch==2.13.0

.PHONY: demo test test-quick test-full env labs jupyter clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile "$(TORCH)" -e ".[dev]"
	@# pip byte-compiles one file at a time; compileall uses every core (about 16 s sooner on 2). torch's internal
	@# test helpers are left out: one is Python 3.12 syntax, and nothing here imports them.
	$(BIN)/python -m compileall -q -j 0 -x '/torch/testing/_internal/' $(VENV)/lib > /dev/null
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(BIN)/specdec tour

# Two pytest-xdist workers (a 2-core machine); a module whose tests share a fixture runs on one worker
# (tests/conftest.py: its pytest_xdist_make_scheduler), and the slow tests are handed out first.
XDIST  ?= -n 2 --dist loadgroup

# The project's own modules byte-compiled first (only the changed ones: a second or so): this machine's
# PYTHONDONTWRITEBYTECODE would otherwise have each of the suite's ~160 processes (servers, kernels, the CLI)
# compile them again, about 0.2 s of CPU each.
COMPILE_OWN := $(BIN)/python -m compileall -q -j 0 specdec benchmarks > /dev/null

test: $(STAMP)
	$(COMPILE_OWN)
	MPLBACKEND=Agg $(BIN)/python -m pytest -q $(XDIST)

# The notebooks' demonstrations at full size too (make test runs some lectures' timing cells smaller:
# tests/notebook_tools.shrunk): the Lab 2 and Lab 3 lectures and the room test at full size.
test-full: $(STAMP)
	$(COMPILE_OWN)
	SPECDEC_FULL_NOTEBOOKS=1 MPLBACKEND=Agg $(BIN)/python -m pytest -q $(XDIST)

# The edit loop: everything but the tests marked slow (notebooks run and graded, servers started).
test-quick: $(STAMP)
	$(COMPILE_OWN)
	MPLBACKEND=Agg $(BIN)/python -m pytest -q $(XDIST) -m "not slow"

# Regenerate labs/ from solutions/ (never edit labs/ by hand).
labs: $(STAMP)
	$(BIN)/specdec labs

# JupyterLab for the notebooks (not needed by demo or test).
jupyter: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[lab]"
	$(BIN)/jupyter lab

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
