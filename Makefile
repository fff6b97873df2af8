# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# llama.cpp's server for local: models (the `local` extra) is built from source with
# portable flags (a native build dies with SIGILL on some CPUs). The wheel is cached outside
# the tree, keyed by version and flags, so a later install or CI run on the machine reuses it.
LLAMA_VERSION := 0.3.36
LLAMA_CMAKE   := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
WHEEL_CACHE   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/simagent/wheels
LLAMA_WHEELS  := $(WHEEL_CACHE)/llama-cpp-python-$(LLAMA_VERSION)-$(shell printf '%s' '$(LLAMA_CMAKE)' | sha256sum | cut -c1-12)

.PHONY: install run test test-fast test-slow-real test-durations test-deep test-slow test-real test-browser lint docs bench-kernel bench-cli bench-live bench-faults bench-attacks mutate clean llama-wheel

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "simagent needs Python >= 3.11; set PYTHON=python3.11 (or newer)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(MAKE) llama-wheel
	$(PY) -m pip install -q --find-links $(LLAMA_WHEELS) -e ".[dev,simulators,local,local-model]"
	@touch $(STAMP)

# About 3 min on 2 idle cores (11 min on a loaded one); then a cached wheel, in seconds.
llama-wheel:
	@if ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "llama-cpp-python $(LLAMA_VERSION): cached wheel in $(LLAMA_WHEELS)"; \
	else \
	  rm -rf $(LLAMA_WHEELS).tmp && mkdir -p $(LLAMA_WHEELS).tmp && \
	  CMAKE_ARGS="$(LLAMA_CMAKE)" $(PY) -m pip wheel -q --no-deps --no-cache-dir \
	    -w $(LLAMA_WHEELS).tmp "llama-cpp-python==$(LLAMA_VERSION)" && \
	  rm -rf $(LLAMA_WHEELS) && mv $(LLAMA_WHEELS).tmp $(LLAMA_WHEELS); \
	fi

# The main job on embedded defaults: no key, no server. The whole bundled bench in replay
# mode under every context policy (real kernel, real simulators, real graph; scripted model).
run: $(STAMP)
	$(VENV)/bin/simagent bench run --out bench-out
	cp bench-out/summary.md docs/results/bench-summary.md
	$(VENV)/bin/simagent bench provenance --out docs/results/provenance.md

# Two speeds. test-fast: the tests that take well under a second each with the kernel in
# memory (SIMAGENT_TEST_KERNEL=memory: simagent/kernel/memory.py) and start no process: the
# suite to run after each change. `make test` runs it first, then, in one pool, the slow
# ones (pytest marker `slow`: subprocesses, servers, tmux, whole bench runs) on the same
# in-memory kernel and those marked `real` on kernel processes (tests/conftest.py takes the
# variable away for them): what the stand-in cannot show (signals, C-level output, a
# kernel's death, effects, attaching) and one end-to-end run per claim. One pool, so no
# worker idles at one group's tail; a module to a worker, longest module first
# (tests/longest_first.py), so none idles at the pool's.
# test-slow and test-real run each group alone. Two workers (pytest-xdist), four for the
# pool: its tests wait on processes (kernels, servers, tmux) for part of their time, and
# four keep 2 cores busy (the pool 7.3 min, make test 8.7 min, measured idle).
test-fast: $(STAMP)
	SIMAGENT_TEST_KERNEL=memory $(PY) -m pytest -q -n 2 -m "not real and not slow and not browser and not deep"

POOL = SIMAGENT_TEST_KERNEL=memory $(PY) -m pytest -q -n 4 --dist loadscope \
  --no-loadscope-reorder --longest-first -m "(slow or real) and not browser and not deep"
test-slow-real: $(STAMP)
	$(POOL)

# Refreshes tests/durations.json, the pool's order (tests/longest_first.py): one pool run.
test-durations: $(STAMP)
	SIMAGENT_TEST_DURATIONS_OUT=tests/durations.json $(POOL)

test-slow: $(STAMP)
	SIMAGENT_TEST_KERNEL=memory $(PY) -m pytest -q -n 2 -m "slow and not real and not browser and not deep"

test-real: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "real and not browser and not deep"

test: test-fast test-slow-real

# What CI runs after make test (about 5 minutes more, measured idle): the tests marked deep (the other
# workflows of a claim make test shows with one: notebooks of pybamm and stiff scipy runs,
# the longest cantera and ase outputs) and the property tests marked sampled with their
# larger samples (300 SIGKILLs instead of 50, 10,000 message lists instead of 2,000).
test-deep: $(STAMP)
	SIMAGENT_TEST_DEEP=1 SIMAGENT_KILLS=300 SIMAGENT_TEST_KERNEL=memory $(PY) -m pytest -q \
	  -n 2 --dist worksteal -m "(deep or sampled) and not browser"

# simagent in JupyterLab's chat in a real browser (issue 39; tests/browser/, marker
# `browser`, which the three groups above leave out): JupyterLab with jupyter-ai and the
# persona on loopback, Debian's Chromium driven by Playwright. Installs what is missing:
# the jupyter extra and Playwright into the venv (Playwright's own browser download is not
# used), and chromium with apt-get (as root; otherwise it says what to run). Prints the
# prompt-to-first-text latency and writes docs/images/jupyterlab-chat.png; then the persona's
# own tests (tests/test_jupyter_persona.py: make test skips them without the extra). About a minute.
PLAYWRIGHT := playwright==1.65.2
test-browser: $(STAMP)
	@$(PY) -c 'import jupyter_ai_acp_client, playwright' 2>/dev/null || \
	  $(PY) -m pip install -q -e ".[jupyter]" "$(PLAYWRIGHT)"
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; \
	  else \
	    echo "make test-browser needs Debian's chromium at /usr/bin/chromium: run sudo apt-get install chromium" >&2; exit 2; \
	  fi; }
	$(PY) -m pytest -q -s -p no:cacheprovider -m browser tests/browser
	$(PY) -m pytest -q -p no:cacheprovider tests/test_jupyter_persona.py

# Imports run one way (the layers in pyproject.toml's [tool.importlinter]; ARCHITECTURE.md).
lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-logo

# The documentation site (mkdocs-material, mkdocs.yml): --strict fails on a broken link or
# anchor; the CLI and [context] references are generated from the code as it builds.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

bench-kernel: $(STAMP)
	$(VENV)/bin/simagent bench kernel

# Each usage error (empty prompt, missing scripted: file, workspace a file, bad -o folder,
# broken config...) as a whole process, 5 runs: min/median/max seconds; the goal is < 1 s.
bench-cli: $(STAMP)
	$(VENV)/bin/simagent bench cli

# A real model (issues 29, 41): a packaged local model through llama.cpp's server on every
# workflow tagged `live` (bench/workflows/live-*.toml: short, one clear number each, graded in
# any phrasing; frozen), simagent vs stock deepagents at 8k: 26 runs for 13 workflows. MODEL=
# local:qwen2.5-coder-1.5b runs the larger model (the local-model-1.5b extra); LIVE_WINDOWS=
# 8k,16k adds 16k, which doubles the runs. Duration and success rate: README.
MODEL          ?= local:qwen2.5-coder-0.5b
LIVE_WINDOWS   ?= 8k
LIVE_WORKFLOWS ?= $(sort $(basename $(notdir $(wildcard bench/workflows/live-*.toml))))
LIVE_OUT       ?= bench-live-out/$(subst :,-,$(MODEL))
bench-live: $(STAMP)
	$(VENV)/bin/simagent bench run --mode live --model $(MODEL) \
	  --policy simagent,stock --window $(LIVE_WINDOWS) --out $(LIVE_OUT) $(LIVE_WORKFLOWS)

# Every fault simagent claims to survive, run for real; one row each (a few minutes).
bench-faults: $(STAMP)
	$(VENV)/bin/simagent bench faults

# Every attack simagent holds against, run for real (a few minutes): writes
# docs/results/attacks.json and .md and renders the security table (docs/security.md) from them.
bench-attacks: $(STAMP)
	$(VENV)/bin/simagent bench attacks --out docs/results --readme docs/security.md

# Mutation testing of the pure cores ([tool.mutmut] in pyproject.toml; not in CI, about an
# hour on 2 cores). Runs in a scratch copy so mutants/ never lands in the tree; prints the
# score per module (README states it).
MUTATE_DIR ?= $(or $(TMPDIR),/tmp)/simagent-mutate
mutate: $(STAMP)
	$(PY) -m pip install -q "mutmut==3.8.1"
	rm -rf $(MUTATE_DIR) && mkdir -p $(MUTATE_DIR)
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t $(MUTATE_DIR)
	cd $(MUTATE_DIR) && $(abspath $(VENV))/bin/mutmut run --max-children 2 || true
	$(PY) tests/mutation_score.py $(MUTATE_DIR)

clean:
	rm -rf $(VENV) build dist *.egg-info site
