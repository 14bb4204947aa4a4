# Flora — two-command Quickstart: `make demo` and `make test`.
# Each target creates .venv and installs the pinned stack when missing.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.flora-installed
export GX_ANALYTICS_ENABLED := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MPLBACKEND := Agg

.PHONY: venv demo test lint lock clean kinetix

# pytest-xdist workers for `make test`: one per core of the 2-core CI machine. Files stay
# whole on one worker (--dist loadfile) so module fixtures are built once.
TEST_WORKERS ?= 2

# Extra index for the torch wheel, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu for
# the CPU build on an ordinary machine (empty: the default index / local wheels).
TORCH_INDEX ?=
PIP_TORCH := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# requirements.lock pins the whole resolved stack (see docs/dependencies.md).
	$(PY) -m pip install -q $(PIP_TORCH) -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

# Kinetix extra (JAX env for `flora policy bench --env kinetix`); constrained by the lock so it
# cannot move torch/numpy/scipy or any other pinned package.
KINETIX_STAMP := $(VENV)/.flora-kinetix
$(KINETIX_STAMP): $(STAMP) pyproject.toml requirements.lock
	$(PY) -m pip install -q $(PIP_TORCH) -c requirements.lock -e '.[kinetix]'
	@touch $(KINETIX_STAMP)

kinetix: $(KINETIX_STAMP)

demo: venv
	$(VENV)/bin/python -m flora.demo

test: venv kinetix
	tools/ensure_chromium.sh
	tools/ensure_postgres.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# Re-resolve the stack from pyproject.toml and re-pin it (needs the package registries).
lock:
	rm -rf /tmp/flora-lock && $(PYTHON) -m venv /tmp/flora-lock
	/tmp/flora-lock/bin/pip install -q --upgrade pip && /tmp/flora-lock/bin/pip install -q $(PIP_TORCH) -e '.[dev]'
	# A local version (torch==X+cpu) only exists on the PyTorch index: pin the public one.
	/tmp/flora-lock/bin/pip freeze --exclude-editable | grep -v '^flora' \
		| sed -E 's/^([^=]+==[^+]+)\+[A-Za-z0-9.]+$$/\1/' > requirements.lock

clean:
	rm -rf .flora $(VENV)
