# promshift — `make demo` runs the main job, `make test` runs every test. Both set up what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NODES ?= 200
SCENARIO ?= happy
# GROUP, TARGET, DEPLOY: empty = the scenario's own (gpu-utilization, prometheus, remote_write; the
# lifecycle scenarios: gpu-memory, amp, scraper; fleet: its three groups onto two local AMP workspaces, amp).
GROUP ?=
# TARGET=amp: migrate onto the local AWS's AMP workspace (SigV4 front door, moto control plane, signing relay).
TARGET ?=
# HISTORY=24h: backfill that much of the group's history on both sides first, time the production windows.
HISTORY ?=
# DEPLOY=scraper (with TARGET=amp): AMP's managed collector writes the group instead of a remote_write entry;
# DEPLOY=k8s-cr (with TARGET=amp): the entry goes into prometheus-operator's Prometheus resource on a local
# Kubernetes API contract server (not a cluster), whose operator stand-in renders it onto the source.
# DEPLOY=git: the entry is a commit (a pull request) in a local config repository, synced onto the source by a
# reconciler stand-in (docs/git-deploy.md).
DEPLOY ?=
# EXECUTOR=celery: Airflow as separate processes with two Celery workers (each its own PROMSHIFT_HOME) on the
# machine's Redis (broker, 127.0.0.1:6379/5) and PostgreSQL (metadata, audit log; 127.0.0.1:5432, user postgres).
EXECUTOR ?= local
export PROMSHIFT_HOME ?= $(CURDIR)/.state

.PHONY: demo test e2e unit lint stack-up stack-down stack-status requirements prometheus chromium clean

# Debian's prometheus + promtool (the package does not start a service), and vmagent from Debian's
# victoria-metrics package: the AMP stack's signing relay (Debian's Prometheus does not SigV4-sign).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  { echo "installing Debian's prometheus package"; apt-get update -qq && apt-get install -y -qq prometheus >/dev/null; }
	@command -v vmagent >/dev/null || \
	  { echo "installing Debian's victoria-metrics package (vmagent)"; apt-get update -qq && apt-get install -y -qq victoria-metrics >/dev/null; }
	@command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null || \
	  { echo "installing Debian's prometheus-alertmanager package"; apt-get update -qq && apt-get install -y -qq prometheus-alertmanager >/dev/null; }

# Debian's headless browser and its WebDriver, for the migration board's browser test (tests/board).
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { echo "installing Debian's chromium and chromium-driver packages"; apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@command -v uv >/dev/null || $(PYTHON) -m pip install -q uv
	@test -x $(PY) || uv venv -q --python $(PYTHON) $(VENV)
	VIRTUAL_ENV=$(VENV) uv pip install -q -r requirements.txt -r requirements-dev.txt
	VIRTUAL_ENV=$(VENV) uv pip install -q --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

demo: prometheus $(STAMP)
	$(PY) -m promshift.local.demo --scenario $(SCENARIO)$(if $(GROUP), --group $(GROUP))$(if $(TARGET), --target $(TARGET))$(if $(DEPLOY), --deploy $(DEPLOY)) --nodes $(NODES) --executor $(EXECUTOR)$(if $(strip $(HISTORY)), --history $(strip $(HISTORY)))

# The README's test command, about 9 minutes on 2 cores: lint; the unit tier (no process: tests/conftest.py refuses
# one); then, on two workers, integration against real servers (with the package test) and the e2e spine
# (happy path and drift on one Airflow). Each tier prints its 20 slowest tests. The two-worker tiers keep
# tests/conftest.py's module order, longest first (--no-loadscope-reorder; docs/testing.md).
PYTEST := $(VENV)/bin/pytest -q -p no:cacheprovider --durations=20
UNIT_TIER := not integration and not e2e and not slow
test: prometheus $(STAMP)
	$(VENV)/bin/ruff check include dags plugins tests bench
	$(PYTEST) -n 2 -m "$(UNIT_TIER)" tests
	$(PYTEST) -n 2 --dist loadfile --no-loadscope-reorder -m "(integration and not slow) or spine" tests

# The other end-to-end scenarios (AMP, bad credentials, k8s-cr, Celery, lifecycle), the board in a browser, and
# the fault matrix; .ci/run runs it after make test.
e2e: prometheus chromium $(STAMP)
	$(PYTEST) -n 2 --dist loadfile --no-loadscope-reorder -m "(e2e and not spine) or slow" tests

# The unit tier alone: no process, no promtool, no server (about a minute).
unit: $(STAMP)
	$(PYTEST) -m "$(UNIT_TIER)" tests

stack-up: prometheus $(STAMP)
	$(PY) -m promshift.local stack up --nodes $(NODES)

stack-down: $(STAMP)
	$(PY) -m promshift.local stack down

stack-status: $(STAMP)
	$(PY) -m promshift.local stack status

# Re-pin after editing requirements*.in, under Airflow's constraints (constraints/ says where that file came from).
AIRFLOW_CONSTRAINTS ?= constraints/airflow-3.3.2-python3.11.txt
requirements:
	uv pip compile -q requirements.in -o requirements.txt --python-version 3.11 -c $(AIRFLOW_CONSTRAINTS)
	uv pip compile -q requirements-dev.in -o requirements-dev.txt --python-version 3.11

clean: stack-down
	rm -rf .state reports
