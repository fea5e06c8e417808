# The two commands of the README. Everything the project needs is installed here, into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specdec-installed
# A pinned torch: an unpinned one pulls gigabytes of CUDA packages on a CPU machine.
TORCH  ?= torch==2.13.0

.PHONY: demo test env labs jupyter clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(BIN)/specdec tour

test: $(STAMP)
	MPLBACKEND=Agg $(BIN)/python -m pytest -q

# Regenerate labs/ from solutions/ (never edit labs/ by hand).
labs: $(STAMP)
	$(BIN)/specdec labs

# JupyterLab for the notebooks (not needed by demo or test).
jupyter: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[lab]"
	$(BIN)/jupyter lab

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
