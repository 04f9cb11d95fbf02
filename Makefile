# The two commands of the quick start (make demo, make test) set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The real-vLLM tier (vLLM CPU build, NIXL and a tiny local model) lives in its own venv: see scripts/setup_vllm.sh.
VLLM_VENV ?= .venv-vllm
VLLM_MODEL ?= .venv-vllm/tiny-model

.PHONY: demo test lint bench clean vllm example compiled

# setup.py and the C source: an editable install builds the C extension (src/calroute/routing/_native.c) in place.
$(STAMP): pyproject.toml setup.py src/calroute/routing/_native.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/calroute demo --out out/demo

test: $(STAMP) vllm compiled
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks setup.py
	$(BIN)/ruff format --check src tests benchmarks setup.py
	$(BIN)/mypy

# The mypyc-compiled simulator (setup.py says which modules): for the speed benchmark, the test that it writes the
# same records as the sources, and `PYTHONPATH=build/compiled calroute simulate ...`. Rebuilt when src/ changes.
COMPILED := build/compiled
compiled: $(COMPILED)/.built

$(COMPILED)/.built: $(STAMP) setup.py $(shell find src/calroute -name '*.py' -o -name '*.c')
	$(BIN)/pip install --quiet 'setuptools>=68' 'wheel>=0.41'
	rm -rf $(COMPILED) build/lib* build/temp*
	CALROUTE_COMPILE=1 $(BIN)/pip install --quiet --no-deps --no-build-isolation --target $(COMPILED) .
	touch $@

vllm: $(VLLM_VENV)/.complete $(VLLM_MODEL)/config.json

# Grouped target: a missing marker or a missing model reruns the (idempotent) script once.
$(VLLM_VENV)/.complete $(VLLM_MODEL)/config.json &:
	bash scripts/setup_vllm.sh $(VLLM_VENV) $(VLLM_MODEL)

# Regenerates the example report committed under docs/example-demo/: the demo with three live seeds (~13 min).
example: $(STAMP)
	$(BIN)/calroute demo --seeds 3 --out out/example
	rm -rf docs/example-demo && mkdir -p docs/example-demo/live
	cp out/example/report.md out/example/goodput.png out/example/calibration.json docs/example-demo/
	cp out/example/live/*.png docs/example-demo/live/

# Every benchmark that finishes within a few minutes (10 - 12 in all); benchmarks/README.md gives each one's
# time and the long ones' commands (proxy_overhead, soak, tune_speed).
bench: $(STAMP) compiled
	$(BIN)/python benchmarks/sim_speed.py
	$(BIN)/python benchmarks/decision_speed.py
	$(BIN)/python benchmarks/emulator_capacity.py
	$(BIN)/python benchmarks/attack.py
	$(BIN)/python benchmarks/executor_speed.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) build out .pytest_cache .mypy_cache .ruff_cache
