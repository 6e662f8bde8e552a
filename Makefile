# coderun: `make demo` runs a real CodeRun on a local cluster; `make test` runs every test tier.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
export KUBECONFIG := $(CURDIR)/.cluster/kubeconfig
KUBECTL = $(shell source e2e/cluster/versions.sh && echo $$CODERUN_CACHE/bin/kubernetes-$$KUBERNETES_VERSION/kubectl)

.PHONY: help venv crds cluster-up cluster-down cluster-status up down demo test test-unit test-e2e bench bench-idle

help:
	@echo "make demo   - from nothing: local cluster, operator, a real CodeRun, its status"
	@echo "make test   - unit, runner and e2e tests (starts the local cluster if needed)"
	@echo "make up | down | cluster-up | cluster-down | cluster-status | crds | bench | bench-idle"

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,mcp,agent,test]'
	touch $@

crds: venv
	$(PY) -m coderun.api.crd crds

cluster-up: venv
	bash e2e/cluster/cluster.sh up

cluster-down:
	bash e2e/cluster/cluster.sh down

cluster-status:
	bash e2e/cluster/cluster.sh status

up: cluster-up
	$(KUBECTL) apply -f crds/ >/dev/null
	$(KUBECTL) wait --for condition=Established crd/coderuns.coderun.io crd/coderunpolicies.coderun.io --timeout=60s >/dev/null
	bash e2e/operator.sh start

down:
	bash e2e/operator.sh stop
	bash e2e/cluster/cluster.sh down

demo: up
	@bash examples/demo.sh "$(KUBECTL)"

test-unit: venv
	$(PY) -m pytest tests -q

test-e2e: up
	$(PY) -m pytest e2e -q

test: test-unit test-e2e

bench: up
	$(PY) e2e/bench_latency.py

bench-idle: up
	$(PY) e2e/bench_idle.py
