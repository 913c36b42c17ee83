# The two commands of the quick start: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel of this exact version lies on the build machines' disk; a looser
# request would download a multi-GB CUDA build. Elsewhere, pass for example
# TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH := torch==2.13.0
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.installed
DEMO := out/demo

.PHONY: install demo test test-all test-p4 bench clean

# A .venv copied from another checkout runs that checkout's code (its scripts' #! lines and the
# editable install name the folder it was built in) while its stamp says it is installed: one whose
# pip names another folder is removed here and built again.
ifneq ($(wildcard $(BIN)/pip),)
ifeq ($(findstring $(CURDIR)/$(VENV)/bin/python,$(shell head -1 $(BIN)/pip)),)
$(info $(VENV) was built for another folder ($(shell head -1 $(BIN)/pip)); building it again here)
$(shell rm -rf $(VENV))
endif
endif

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[capture,test]"
	touch $(STAMP)

demo: install
	@mkdir -p $(DEMO)
	$(BIN)/emu capture --model mlp --iters 3 --bucket-cap-mb 4 -o $(DEMO)/mlp.json.gz
	$(BIN)/emu inspect $(DEMO)/mlp.json.gz
	$(BIN)/emu replay $(DEMO)/mlp.json.gz --workers 8 --fabric ina,ring --report $(DEMO)/replay.json
	@echo "At 100 Gb/s the communication hides behind compute. At 10 Gb/s it does not:"
	$(BIN)/emu sweep $(DEMO)/mlp.json.gz --workers 8,64 --fabric ina,ring --bandwidth 10Gbps \
		--iters 1 --payload-scale 64 --out $(DEMO)/study

# Two pytest workers (pytest-xdist): the default tier's tests wait on real processes and sockets
# as much as they compute, so two of them share this 2-core machine well (measured 2026-12-03:
# 3 min 47 s against 6 min 44 s in one process). test-all stays in one process: its
# wall-clock calibration wants a quiet machine.
test: install
	$(BIN)/ruff check --quiet emu tests benchmarks examples
	$(BIN)/python -m pytest -q -m "not slow and not p4" -n 2

test-all: install
	$(BIN)/python -m pytest -q

# emu's P4 program on a real BMv2: needs root, p4c-bm2-ss and simple_switch_grpc on PATH (built
# from p4lang's sources: docs/p4.md); its tests skip, saying why, where they are missing
test-p4: install
	$(BIN)/pip install --quiet -e ".[p4]"
	$(BIN)/python -m pytest -q -m p4 tests/p4

bench: install
	$(BIN)/python benchmarks/capture_overhead.py

clean:
	rm -rf $(VENV) out .pytest_cache
