# Two entry points: `make demo` (run a local cluster and show it working) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast chaos lint format env test-env etcd rdma protos clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[reference,nixl,test]'
	touch $(STAMP)

env: $(STAMP)

# etcd is a real server binary the tests start on a free loopback port.
etcd:
	@command -v etcd >/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server) >/dev/null; \
	  else echo "etcd not found: install etcd 3.4+ and put it on PATH" >&2; exit 1; fi; }
	@etcd --version | head -1

# The RDMA userspace libraries (and, as apt recommends, their providers) that every InfiniBand or
# RoCE GPU host has: the suite runs beside them, as NIXL's UCX does there (dataplane/transport/nixl.py).
rdma:
	@dpkg -s libibverbs1 librdmacm1 >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 librdmacm1) >/dev/null; \
	  else echo "install the RDMA userspace libraries (libibverbs, librdmacm) to test beside them" >&2; fi; }

demo: env
	$(PY) -m kvplane.demo

test: env etcd rdma lint
	$(PY) -m pytest -q

# The chaos suite: a seeded, randomized fault schedule against a local etcd-backed cluster under
# checked greedy traffic (tests/chaos/run.py). CHAOS_ARGS="--steps 8" for a short run (CI).
CHAOS_ARGS ?= --seed 7 --steps 16
chaos: env etcd rdma
	$(PY) -m tests.chaos.run $(CHAOS_ARGS)

# The process-free tests only (seconds): what to run while editing.
test-fast: env
	$(PY) -m pytest -q -m "not cluster"

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
