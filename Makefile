# User-facing targets: `make reproduce`, `make test` and `make lab`.
# Each creates .venv and installs the package when missing or when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODE ?= quick
# notebooks at once: quick mode runs the ones that measure no time two at a time, one thread
# each (docs/profile.md: 0.88x the wall time of one notebook at a time on two cores)
JOBS ?= $(if $(filter quick,$(MODE)),2,1)
# more `localsgd reproduce` flags, e.g. ARGS="--only fig04_convex_time --set n_seeds=1"
ARGS ?=

.PHONY: reproduce test lab
PORT ?= 8888

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (localsgd)" >/dev/null
	touch $(STAMP)

reproduce: $(STAMP)
	$(BIN)/localsgd reproduce --mode $(MODE) --jobs $(JOBS) $(ARGS)

# three xdist workers on two cores, one OpenMP thread each: a worker waiting for a kernel,
# a torchrun rendezvous or the browser leaves its core idle (5 % of the first run's CPU time
# with two workers, 2 % with three: docs/notebooks.md, where the wall times, within the
# machine's hour-to-hour drift, are too). Tests that bound wall time scale the bound by the
# load they measure (tests/conftest.py: slowdown). An idle worker steals queued tests
# (worksteal), so the long notebook tests do not end on one worker. The documented commands
# and the fresh-venv install run after the rest: their many-process launches and torch install
# would disturb the tests that measure time. The install, the longest of them, is listed
# first: each worker starts on its part of the list in order, so listed last it ran alone at
# the end.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 3 --dist worksteal --durations=30 tests \
	  --deselect tests/test_doc_commands.py --deselect tests/test_base_install.py
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 3 --dist worksteal tests/test_base_install.py \
	  tests/test_doc_commands.py

# JupyterLab on loopback (the printed URL carries the token), opened on notebooks/ with this
# venv's kernel "python3"; Agg (set by CI) would hide the inline figures, hence env -u MPLBACKEND;
# as root (containers) Jupyter refuses to start without --allow-root
lab: $(STAMP)
	env -u MPLBACKEND JUPYTER_PREFER_ENV_PATH=1 $(BIN)/jupyter lab --ip=127.0.0.1 \
	  --port=$(PORT) --no-browser --ServerApp.root_dir="$(CURDIR)" \
	  --LabApp.default_url=/lab/tree/notebooks $(if $(filter 0,$(shell id -u)),--allow-root)
