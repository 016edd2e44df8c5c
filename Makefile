# Two user-facing targets: `make reproduce` and `make test`.
# Each creates .venv and installs the package when missing or when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODE ?= quick

.PHONY: reproduce test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (localsgd)" >/dev/null
	touch $(STAMP)

reproduce: $(STAMP)
	$(BIN)/localsgd reproduce --mode $(MODE)

# two xdist workers on two cores: one OpenMP thread each avoids oversubscription
test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 tests
