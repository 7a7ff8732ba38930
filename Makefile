# Quick start: `make demo` (set up, run the main job) and `make test` (set up, run the tests).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo picture test bench validate validate-serving validate-aic setup gpu-loop
setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
	$(VENV)/bin/python -m compileall -q src/perfcast > /dev/null  # (an editable install is not byte-compiled)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/perfcast optimize qwen3-32b --devices h200-sxm --total-devices 8 --isl 4000 --osl 500 \
	    --ttft 2 --tpot 0.03 --serving-mode both

# the README's picture: the demo search's Pareto front (docs/images/quickstart/pareto.png, .svg)
picture: $(STAMP)
	$(VENV)/bin/perfcast optimize qwen3-32b --devices h200-sxm --total-devices 8 --isl 4000 --osl 500 \
	    --ttft 2 --tpot 0.03 --serving-mode both --plot docs/images/quickstart

# two workers (CI's two cores), each test file on one worker: a file's module fixtures are built once
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/kernel_accuracy.py
	$(VENV)/bin/python benchmarks/dsa_module_accuracy.py
	$(VENV)/bin/python benchmarks/mla_module_accuracy.py
	$(VENV)/bin/python benchmarks/flash_attention_grid.py
	$(VENV)/bin/python benchmarks/textgen_cold.py
	$(VENV)/bin/python benchmarks/lookup_speed.py
	$(VENV)/bin/python benchmarks/db_load.py
	$(VENV)/bin/python benchmarks/loo_accuracy.py
	$(VENV)/bin/python benchmarks/slow_rollup.py
	$(VENV)/bin/python benchmarks/nccl_accuracy.py
	$(VENV)/bin/python benchmarks/hardening_census.py
	$(VENV)/bin/python benchmarks/step_speed.py
	$(VENV)/bin/python benchmarks/serving_speed.py
	$(VENV)/bin/python benchmarks/meanfield_speed.py
	$(VENV)/bin/python benchmarks/optimize_speed.py
	$(VENV)/bin/python benchmarks/sweep_ray.py

validate: $(STAMP)
	$(VENV)/bin/python benchmarks/validate_cpu_local.py

validate-serving: $(STAMP)
	$(VENV)/bin/python benchmarks/validate_targets.py
	$(VENV)/bin/python benchmarks/serving_targets.py
	$(VENV)/bin/python benchmarks/max_throughput_check.py

# aiconfigurator itself, same run, on the serving targets' rows: sets up .venv-aic (aiconfigurator==0.12.0
# from PyPI, once) and compares it with perfcast's replay (docs/design/validation.md, "The competitor")
validate-aic: $(STAMP)
	$(VENV)/bin/python benchmarks/aic_baseline.py

# The GPU closed loop needs a CUDA GPU: this prints how to run it (docs/design/validation.md).
gpu-loop:
	@echo "On a machine with a CUDA GPU (H100/H200/B200; others need --perfcast-device):"
	@echo "  python benchmarks/gpu_closed_loop.py --out DIR   # 3 models x 8 steps, stops at --budget-s 360"
	@echo "Anywhere, the same code on the CPU with tiny models:"
	@echo "  python benchmarks/gpu_closed_loop.py --device cpu --tiny --threads 1"
	@echo "On the device tool: sh tools/device_site.sh packs the packages to carry (.site.tgz);"
	@echo "  the one command is in docs/design/validation.md, section 'GPU closed loop'."
	@echo "A measured run priced again anywhere:"
	@echo "  python benchmarks/gpu_closed_loop.py --repredict benchmarks/measured/h200-2026-12-04 --out DIR"
