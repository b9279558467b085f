# Two entry points: `make demo` (run a local cluster and show it working) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast chaos test-engines engines-env lint format env test-env etcd nats rdma kubectl prometheus protos clean

# The tests need every extra (`[test]` names them); the demo only a control plane and reference-engine agents.
$(STAMP): pyproject.toml setup.py kvplane/_pricing.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml setup.py kvplane/_pricing.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,reference]'
	touch $(DEMO_STAMP)

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

# nats-server (JetStream) is the bus of several control-plane replicas (controlplane/bus/nats.py);
# the tests and the chaos suite start it on a free loopback port.
nats:
	@command -v nats-server >/dev/null || test -x /usr/sbin/nats-server || { \
	  if command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server) >/dev/null; \
	  else echo "nats-server not found: install nats-server 2.9+ and put it on PATH" >&2; exit 1; fi; }
	@PATH="$$PATH:/usr/sbin" nats-server --version

# The RDMA userspace libraries (and, as apt recommends, their providers) that every InfiniBand or
# RoCE GPU host has: the suite runs beside them, as NIXL's UCX does there (dataplane/transport/nixl.py).
rdma:
	@dpkg -s libibverbs1 librdmacm1 >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 librdmacm1) >/dev/null; \
	  else echo "install the RDMA userspace libraries (libibverbs, librdmacm) to test beside them" >&2; fi; }

# kubectl renders deploy/k8s's overlays with its built-in kustomize (tests/deploy); Debian's
# kubernetes-client is kubectl 1.20 (kustomize v2), which the overlays are written for as well.
kubectl:
	@command -v kubectl >/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client) >/dev/null; \
	  else echo "kubectl not found: install kubectl (any version from 1.20) and put it on PATH" >&2; exit 1; fi; }
	@kubectl version --client 2>/dev/null | head -1

# A real Prometheus server and promtool: tests/deploy/test_prometheus.py scrapes a local cluster with
# deploy/monitoring's config, rules and dashboard queries.
prometheus:
	@{ command -v prometheus && command -v promtool; } >/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) >/dev/null; \
	  else echo "prometheus not found: install Prometheus 2.x (server and promtool) and put them on PATH" >&2; exit 1; fi; }
	@prometheus --version 2>&1 | head -1

demo: $(DEMO_STAMP)
	$(PY) -m kvplane.apps.demo

# Twice as many pytest processes as cores, at most 8 (each may run a cluster of torch processes),
# whole files each (a module's cluster starts once): most of the suite waits on the servers its
# tests start (measured: 0.8 of a core busy serially).
TEST_WORKERS ?= $(shell n=$$(( $$(nproc) * 2 )); echo $$(( n < 8 ? n : 8 )))
test: env etcd nats rdma kubectl prometheus lint
	$(PY) -m pytest -q -m "not engines" -n $(TEST_WORKERS) --dist loadfile

# kvplane beside real vLLM and SGLang servers (tests/engines/test_engine_clusters.py): creates the
# engines' virtualenvs first (minutes, once). About 10 minutes on 2 cores; see docs/operations.md.
test-engines: engines-env etcd rdma
	$(PY) -m pytest -q -m engines tests/engines

# The chaos suite: a seeded, randomized fault schedule against a local etcd-backed cluster under
# checked greedy traffic (tests/chaos/run.py). CHAOS_ARGS="--steps 8" for a short run (CI).
CHAOS_ARGS ?= --seed 7 --steps 16
chaos: env etcd nats rdma
	$(PY) -m tests.chaos.run $(CHAOS_ARGS)

# The process-free tests only (seconds): what to run while editing.
test-fast: env
	$(PY) -m pytest -q -m "not cluster and not engines" -n $(TEST_WORKERS) --dist loadfile

lint: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: env
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

protos: env
	$(PY) -m kvplane.apps.protogen

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache build kvplane/_pricing.*.so
