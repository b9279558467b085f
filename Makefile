# Two entry points: `make demo` (run a local cluster and show it working) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-engines engines-env lint format env test-env etcd protos clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[reference,nixl,engines,test]'
	touch $(STAMP)

env: $(STAMP)

# The external engines kvplane's agent sits beside, each in its own virtualenv (they pin their own
# torch and never share kvplane's): vLLM's CPU build and SGLang, at the versions in deploy/engines/.
# About 3.5 GB and 6 GB; a few minutes each from the package index.
VLLM_VENV ?= .venv-vllm
SGLANG_VENV ?= .venv-sglang

$(VLLM_VENV)/.installed: deploy/engines/vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -r deploy/engines/vllm.txt
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

$(SGLANG_VENV)/.installed: deploy/engines/sglang.txt
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q -r deploy/engines/sglang.txt
	touch $@

engines-env: env $(VLLM_VENV)/.installed $(SGLANG_VENV)/.installed

# etcd is a real server binary the tests start on a free loopback port.
etcd:
	@command -v etcd >/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server) >/dev/null; \
	  else echo "etcd not found: install etcd 3.4+ and put it on PATH" >&2; exit 1; fi; }
	@etcd --version | head -1

demo: env
	$(PY) -m kvplane.demo

test: env etcd lint
	$(PY) -m pytest -q -m "not engines"

# kvplane beside real vLLM and SGLang servers (tests/engines/test_engine_clusters.py): creates the
# engines' virtualenvs first (minutes, once). About 10 minutes on 2 cores; see docs/operations.md.
test-engines: engines-env etcd
	$(PY) -m pytest -q -m engines tests/engines

# The process-free tests only (seconds): what to run while editing.
test-fast: env
	$(PY) -m pytest -q -m "not cluster and not engines"

lint: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: env
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

protos: env
	$(PY) -m kvplane.protogen

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
