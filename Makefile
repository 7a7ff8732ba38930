# Quick start: `make demo` (set up, run the main job) and `make test` (set up, run the tests).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test bench validate setup
setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/perfcast text-generate llama-3.1-8b

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/flash_attention_grid.py
	$(VENV)/bin/python benchmarks/textgen_cold.py
	$(VENV)/bin/python benchmarks/lookup_speed.py
	$(VENV)/bin/python benchmarks/db_load.py
	$(VENV)/bin/python benchmarks/loo_accuracy.py
	$(VENV)/bin/python benchmarks/slow_rollup.py
	$(VENV)/bin/python benchmarks/nccl_accuracy.py

validate: $(STAMP)
	$(VENV)/bin/python benchmarks/validate_cpu_local.py
