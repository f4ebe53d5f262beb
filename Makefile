# Orchard Env operator: every entry point. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
HOST_TRIPLE := x86_64-unknown-linux-gnu
# A clean CI clone builds everything once: incremental caches would only cost disk.
ifeq ($(CI),true)
export CARGO_INCREMENTAL ?= 0
endif
# The agent is linked statically against glibc (crt-static): there is no musl target on this machine.
AGENT_BIN := $(TARGET_DIR)/$(HOST_TRIPLE)/agent/orchard-agent
NODE_BIN_DIR := $(TARGET_DIR)/$(HOST_TRIPLE)/agent

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sort

.PHONY: build
build: agent ## build the operator, crdgen, bar-sim and the static agent
	$(CARGO) build --release -p orchard-operator
	$(CARGO) build --release -p orchard-bar --features sim --bin bar-sim

.PHONY: plugin
plugin: ## build the `kubectl orchard` plugin (target/release/kubectl-orchard; put it on PATH: docs/KUBECTL.md)
	$(CARGO) build --release -p kubectl-orchard
	@echo "kubectl-orchard: $(TARGET_DIR)/release/kubectl-orchard"

.PHONY: agent
agent: ## build the static orchard-agent binary (glibc crt-static)
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --profile agent -p orchard-agent --target $(HOST_TRIPLE)
	@ls -l $(AGENT_BIN) | awk '{printf "orchard-agent: %s bytes\n", $$5}'

.PHONY: node-bins
node-bins: ## build the real node's static programs (orchard-pause, orchard-probe, orchard-layer-filter), glibc crt-static like the agent
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --profile agent -p orchard-node-bins --target $(HOST_TRIPLE)

.PHONY: agent-check
agent-check: agent ## prove the static agent runs in an empty root (chroot): --version, serve, /healthz, exec
	@bash agent/scripts/agent-check.sh $(AGENT_BIN)

.PHONY: test-agent
test-agent: agent ## run the agent's unit and integration tests (the chroot test uses the static binary)
	ORCHARD_AGENT_STATIC_BIN=$(abspath $(AGENT_BIN)) $(CARGO) test -p orchard-agent -j 2

.PHONY: bench-agent
bench-agent: agent ## benchmark the agent (exec p50/p99, file MiB/s, RSS) against a FastAPI agent; writes docs/BENCHMARKS.md
	@bash agent/scripts/bench-venv.sh
	ORCHARD_AGENT_BIN=$(abspath $(AGENT_BIN)) ORCHARD_BENCH_PYTHON=$$HOME/.cache/orchard/bench-venv/bin/python \
		$(CARGO) bench -p orchard-agent --bench agent -j 2 -- --write-doc $(abspath docs/BENCHMARKS.md)

# The BAR benchmark's fixed seed and size: `make bench-bar` always reproduces the committed numbers.
BAR_SIM_ARGS := --seed 20240601 --prompts 10000 --group-size 8 --max-trajectories 16 \
	--positive-min 0.375 --positive-max 0.625 --abort-rates 0,0.05,0.2

.PHONY: test-bar
test-bar: ## run the BAR engine tests (exhaustive, property) and the bar-sim closed-form tests
	$(CARGO) test -p orchard-bar --features sim -j 2

.PHONY: bench-bar
bench-bar: ## run the seeded BAR simulator; writes docs/bar-sim.json and the results section of docs/BAR.md
	$(CARGO) run --release -p orchard-bar --features sim --bin bar-sim -j 2 -- $(BAR_SIM_ARGS) \
		--out-json docs/bar-sim.json --out-md docs/BAR.md

# Fuzzing (agent/fuzz, docs/RELIABILITY.md): cargo-fuzz pinned into ~/.cache/orchard/cargo-fuzz, nightly
# for libFuzzer. Each target runs FUZZ_SECONDS, one at a time, from the committed seeds; new inputs go
# to agent/fuzz/target/fuzz-corpus, crashes to agent/fuzz/artifacts. Not part of `make test`.
FUZZ_SECONDS ?= 50
FUZZ_TARGETS ?=
BAR_PROPTEST_CASES ?= 20000
CARGO_FUZZ_VERSION := 0.13.2
CARGO_FUZZ_ROOT := $(HOME)/.cache/orchard/cargo-fuzz

.PHONY: fuzz-tools
fuzz-tools: ## install cargo-fuzz 0.13.2 (pinned) into ~/.cache/orchard/cargo-fuzz (once)
	@if $(CARGO_FUZZ_ROOT)/bin/cargo-fuzz --version 2>/dev/null | grep -qF '$(CARGO_FUZZ_VERSION)'; then \
		echo "cargo-fuzz $(CARGO_FUZZ_VERSION) present in $(CARGO_FUZZ_ROOT)"; \
	else $(CARGO) install --locked --root $(CARGO_FUZZ_ROOT) cargo-fuzz --version $(CARGO_FUZZ_VERSION); fi

.PHONY: fuzz
fuzz: fuzz-tools ## fuzz the agent (FUZZ_SECONDS per target, default 50) and run the BAR property tests with 20,000 cases
	PATH=$(CARGO_FUZZ_ROOT)/bin:$$PATH bash agent/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)
	@echo "BAR properties: $(BAR_PROPTEST_CASES) cases each"
	PROPTEST_CASES=$(BAR_PROPTEST_CASES) timeout 900 hack/selected-tests.sh 7 $(CARGO) test -p orchard-bar --lib -j 2 -- property_tests

.PHONY: crds
crds: ## regenerate crds/*.yaml from the Rust types
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandbox > crds/sandboxes.orchard.dev.yaml
	$(CARGO) run -q -p orchard-operator --bin crdgen -- rolloutgroup > crds/rolloutgroups.orchard.dev.yaml
	$(CARGO) run -q -p orchard-operator --bin crdgen -- rolloutqueue > crds/rolloutqueues.orchard.dev.yaml
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandboxpool > crds/sandboxpools.orchard.dev.yaml
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandboxsnapshot > crds/sandboxsnapshots.orchard.dev.yaml
	$(MAKE) sync-crds

.PHONY: crds-check
crds-check: ## fail if crds/ differs from what the Rust types generate
	@tmp=$$(mktemp -d); \
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandbox > $$tmp/sandboxes.orchard.dev.yaml && \
	$(CARGO) run -q -p orchard-operator --bin crdgen -- rolloutgroup > $$tmp/rolloutgroups.orchard.dev.yaml && \
	$(CARGO) run -q -p orchard-operator --bin crdgen -- rolloutqueue > $$tmp/rolloutqueues.orchard.dev.yaml && \
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandboxpool > $$tmp/sandboxpools.orchard.dev.yaml && \
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandboxsnapshot > $$tmp/sandboxsnapshots.orchard.dev.yaml && \
	if ! diff -u crds/sandboxes.orchard.dev.yaml $$tmp/sandboxes.orchard.dev.yaml || ! diff -u crds/rolloutgroups.orchard.dev.yaml $$tmp/rolloutgroups.orchard.dev.yaml || ! diff -u crds/rolloutqueues.orchard.dev.yaml $$tmp/rolloutqueues.orchard.dev.yaml || ! diff -u crds/sandboxpools.orchard.dev.yaml $$tmp/sandboxpools.orchard.dev.yaml || ! diff -u crds/sandboxsnapshots.orchard.dev.yaml $$tmp/sandboxsnapshots.orchard.dev.yaml; then \
		echo "crds/ is out of date: run 'make crds' and commit the result" >&2; rm -rf $$tmp; exit 1; fi; \
	rm -rf $$tmp; echo "crds/ matches the Rust types"

# Generated files the tests only compare (e2e/tests/no_cluster/docs_drift.rs, manifests_install.rs): the tests never
# write them, these targets do, with the same generator functions (xtask/src/config_reference.rs, k8s_schemas.rs).
.PHONY: docs
docs: ## regenerate the values reference of docs/CONFIGURATION.md from the `# --` comments of charts/orchard-env/values.yaml
	$(CARGO) run -q -p xtask --bin gen-docs -j 2

.PHONY: schemas
schemas: k8s ## regenerate e2e/packaging-tools/schemas/kubernetes-v1.36.3 (kinds.txt) from a local kube-apiserver's /openapi/v2
	$(CARGO) run -q -p xtask --bin gen-schemas -j 2

.PHONY: lint
lint: ## rustfmt check, clippy with warnings as errors, and the layering check (no import cycles; the operator's layers import only downwards)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test -q -p orchard-layers -j 2
	$(CARGO) clippy -p orchard-bar --all-targets --features sim -- -D warnings
	$(CARGO) clippy -p orchard-api --all-targets --no-default-features -- -D warnings

.PHONY: k8s
k8s: ## build kube-apiserver, kube-controller-manager, etcd, kubelet, kube-scheduler, kube-proxy from pinned Go modules into ~/.cache (once)
	@e2e/k8s-tools/build.sh

# The real node (docs/TESTING.md, "The real node"): Debian packages, containerd and crane, images.
.PHONY: node-deps
node-deps: ## install the real node's Debian packages (runc, CNI plugins, iptables, mmdebstrap, busybox-static, dnsmasq-base and openssl for the fake internet; pinned, needs root)
	@e2e/node-tools/debs.sh

.PHONY: node-tools
node-tools: ## build containerd 2.4, its runc shim, ctr and crane from pinned Go modules into ~/.cache (once)
	@e2e/node-tools/build.sh

STATIC_OPERATOR_BIN := $(TARGET_DIR)/$(HOST_TRIPLE)/release/orchard-operator

.PHONY: static-operator
static-operator: ## build the static (glibc crt-static) release operator that goes into the operator image
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p orchard-operator --bin orchard-operator --target $(HOST_TRIPLE)

.PHONY: operator-image
operator-image: node-tools agent node-bins static-operator ## the operator image for the real node: a static (glibc crt-static) release operator assembled with crane
	@e2e/node-tools/images.sh agent=$(AGENT_BIN) pause=$(NODE_BIN_DIR)/orchard-pause probe=$(NODE_BIN_DIR)/orchard-probe \
		layerfilter=$(NODE_BIN_DIR)/orchard-layer-filter operator=$(STATIC_OPERATOR_BIN)

.PHONY: node-images
node-images: node-deps node-tools agent node-bins ## build the real node's images with crane (Debian+python3+git+curl+pip, Debian+chromium, busybox, a static probe, pause, the agent, the snapshot committer) into ~/.cache/orchard/images
	@e2e/node-tools/images.sh agent=$(AGENT_BIN) pause=$(NODE_BIN_DIR)/orchard-pause probe=$(NODE_BIN_DIR)/orchard-probe \
		layerfilter=$(NODE_BIN_DIR)/orchard-layer-filter

.PHONY: test-unit
test-unit: ## unit tests of the BAR engine and simulator, the API types (CEL rules, agent wire format), the operator (builders, status, reconciles against a scripted API server), the local cluster harness (orchard-testcluster), the generators (xtask), the benchmarks (orchard-bench) and their shared discipline
	$(CARGO) test -p orchard-bar --features sim -j 2
	$(CARGO) test -p orchard-api -j 2
	$(CARGO) test -p orchard-operator -j 2
	$(CARGO) test -p orchard-testcluster -p xtask -p orchard-bench --lib --bins -j 2
	$(CARGO) test -p orchard-bench-support -j 2

.PHONY: e2e
e2e: k8s agent node-images operator-image dist-release obs-tools kwok ## end-to-end tests on the local cluster (real control plane; the hollow node, and the real node for real_node*)
	$(CARGO) build -p orchard-operator -p orchard-testcluster -p kubectl-orchard --bins -j 2
	$(CARGO) test -p orchard-e2e --tests -j 2 -- --test-threads=2

.PHONY: test
test: ## everything CI runs: lint, CRD drift, unit, agent, Harbor environment and end-to-end tests
	$(MAKE) lint
	$(MAKE) crds-check
	$(MAKE) test-unit
	$(MAKE) test-agent
	$(MAKE) test-harbor
	$(MAKE) e2e

.PHONY: demo
demo: k8s agent ## the main job: samples on the real node (hollow node where it cannot run), kubectl get orchard, exec, a BAR group; then teardown
	@$(MAKE) -s node-images || echo "make demo: the real node's parts could not be built here; the demo will use the hollow node"
	$(CARGO) build -p orchard-operator -p orchard-testcluster --bins -j 2
	@scripts/demo.sh

# Name churn for minutes (not part of `make test`): docs/RELIABILITY.md.
SOAK_SECONDS ?= 600
SOAK_NAMES ?= 50

.PHONY: soak
soak: k8s agent ## churn 50 Sandbox and 50 RolloutGroup names for 10 min (SOAK_SECONDS, SOAK_NAMES): stuck objects, leaks, operator memory
	$(CARGO) build -p orchard-operator -p orchard-testcluster -p orchard-bench --bins -j 2
	$(TARGET_DIR)/debug/soak --seconds $(SOAK_SECONDS) --names $(SOAK_NAMES)

.PHONY: sdk-venv
sdk-venv: ## create the Python SDK venv (~/.cache/orchard/sdk-venv: pinned httpx, pytest, pytest-asyncio, mini-swe-agent, swe-rex, playwright; SDK editable)
	@bash sdk/python/scripts/venv.sh

.PHONY: harbor-venv
harbor-venv: ## create the Harbor venv (~/.cache/orchard/harbor-venv, Python 3.12: harbor 0.25.0 and its dependencies pinned by sdk/python/scripts/harbor-constraints.txt, pytest; SDK editable)
	@bash sdk/python/scripts/harbor-venv.sh

# orchard_env.integrations.harbor against a fake gateway (no cluster), with Harbor's own classes; apart from
# sdk/python/tests, which the SDK venv (Python 3.11, no Harbor) runs against the local cluster.
.PHONY: test-harbor
test-harbor: harbor-venv ## unit tests of the Harbor environment (sdk/python/tests_harbor, fake gateway, no cluster) in the Harbor venv
	cd sdk/python && $(HOME)/.cache/orchard/harbor-venv/bin/python -m pytest tests_harbor -p no:cacheprovider -q

# The asyncio client (sdk/python/src/orchard_env/aio.py) is generated from the sync one (client.py), the one
# source of the public methods; sdk/python/tests/test_generated.py fails while the committed aio.py is stale.
.PHONY: sdk-aio
sdk-aio: ## regenerate the SDK's asyncio client (aio.py) from the sync client (client.py): scripts/gen_aio.py
	@python3 sdk/python/scripts/gen_aio.py

.PHONY: test-sdk
test-sdk: k8s agent sdk-venv ## Python SDK tests (pytest) against the local cluster with the real operator
	$(CARGO) build -p orchard-operator -j 2
	ORCHARD_AGENT_BIN=$(abspath $(AGENT_BIN)) hack/selected-tests.sh 1 $(CARGO) test -p orchard-e2e --test hollow_shared -j 2 -- python_sdk:: --nocapture

.PHONY: bench-gateway
bench-gateway: k8s agent sdk-venv ## gateway vs direct exec latency (p50/p99 at concurrency 1 and 64), SDK create->Ready; writes docs/BENCHMARKS.md
	$(CARGO) build --release -p orchard-operator -j 2
	ORCHARD_AGENT_BIN=$(abspath $(AGENT_BIN)) ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(CARGO) run --release -p orchard-bench --example bench_gateway -j 2 -- --write-doc $(abspath docs/BENCHMARKS.md)

.PHONY: bench-egress
bench-egress: ## the egress proxy on loopback against direct HTTPS (512 MiB download MiB/s and CPU, fresh and kept-alive GET p50/p99, 3 alternating rounds) and its policy table at 1,000 and 10,000 sandboxes (build, memory, decide ns); no cluster; writes docs/BENCHMARKS.md
	$(CARGO) run --release -p orchard-bench --bin bench-egress -j 2 -- --write-doc $(abspath docs/BENCHMARKS.md)

# ---------------------------------------------------------------------------------------------------
# Packaging: Helm chart, kustomize, images and real clusters (docs/INSTALL.md).
# helm, kubeconform and openapi2schema are built from the pinned Go module in e2e/packaging-tools
# (GOTOOLCHAIN=local, committed go.sum) into $HOME/.cache/orchard/tools, once.
PACKAGING_TOOLS := e2e/packaging-tools/build.sh
CHART := charts/orchard-env
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
REGISTRY ?= ghcr.io/orchard-env
IMG_TAG ?= $(VERSION)
OPERATOR_REPO ?= $(REGISTRY)/orchard-operator
AGENT_REPO ?= $(REGISTRY)/orchard-agent
OPERATOR_IMG := $(OPERATOR_REPO):$(IMG_TAG)
AGENT_IMG := $(AGENT_REPO):$(IMG_TAG)
KIND_CLUSTER ?= orchard
RELEASE ?= orchard
RELEASE_NAMESPACE ?= orchard-system

.PHONY: tools
tools: ## build helm, kubeconform and openapi2schema from pinned Go modules into ~/.cache/orchard/tools (once)
	@$(PACKAGING_TOOLS)

.PHONY: sync-crds
sync-crds: ## copy the generated crds/*.yaml into the Helm chart and config/crd/bases (run after `make crds`)
	@rm -f $(CHART)/files/crds/*.yaml config/crd/bases/*.yaml
	cp crds/*.yaml $(CHART)/files/crds/
	cp crds/*.yaml config/crd/bases/

.PHONY: helm-lint
helm-lint: ## helm lint --strict the chart with default values and ci/full-values.yaml
	@helm=$$($(PACKAGING_TOOLS) | tail -n 1)/helm; \
	$$helm lint --strict $(CHART) && $$helm lint --strict $(CHART) -f $(CHART)/ci/full-values.yaml

.PHONY: manifests-check
manifests-check: obs-tools ## CRD copies, helm lint, helm template + kustomize renders, kubeconform -strict (k8s 1.36 + CRDs)
	@hack/manifests-check.sh

# A release a user installs elsewhere (docs/INSTALL.md, "Install from a release"): `make dist` writes
# dist/ (gitignored): the chart archive, the operator and agent images (docker save-style tarball and
# OCI image layout archive, built by images.sh from the static binaries), CycloneDX SBOMs, the Python
# SDK's sdist and wheel, and checksums.txt over all of them. x86_64 (linux/amd64) only. Each step
# rewrites its own files; the expensive parts (the binaries, the tools, the Python venvs, the image
# layouts) are cached and not rebuilt on a second run. `make e2e` installs dist-release on the real node.
DIST := dist
# cargo-cyclonedx (CycloneDX's own Cargo plugin: the workspace's resolved Cargo.lock graph per crate,
# dev-dependencies excluded), pinned into ~/.cache/orchard/cargo-cyclonedx (cold build ~3 min on 2 cores, once).
CARGO_CYCLONEDX_VERSION := 0.5.9
CARGO_CYCLONEDX_ROOT := $(HOME)/.cache/orchard/cargo-cyclonedx

.PHONY: sbom-tools
sbom-tools: ## install cargo-cyclonedx 0.5.9 (pinned) into ~/.cache/orchard/cargo-cyclonedx (once)
	@if $(CARGO_CYCLONEDX_ROOT)/bin/cargo-cyclonedx cyclonedx --version 2>/dev/null | grep -qF '$(CARGO_CYCLONEDX_VERSION)'; then \
		echo "cargo-cyclonedx $(CARGO_CYCLONEDX_VERSION) present in $(CARGO_CYCLONEDX_ROOT)"; \
	else $(CARGO) install --locked --root $(CARGO_CYCLONEDX_ROOT) cargo-cyclonedx --version $(CARGO_CYCLONEDX_VERSION); fi

.PHONY: dist-chart
dist-chart: ## dist/orchard-env-VERSION.tgz: helm package, chart version and appVersion = the workspace version
	@mkdir -p $(DIST) && rm -f $(DIST)/orchard-env-*.tgz
	@helm=$$($(PACKAGING_TOOLS) | tail -n 1)/helm; \
	$$helm package $(CHART) --version $(VERSION) --app-version $(VERSION) --destination $(DIST)

.PHONY: dist-images
dist-images: node-tools agent static-operator ## dist/images/orchard-{operator,agent}-VERSION.tar (docker save-style) and .oci.tar (OCI layout), checked
	@rm -rf $(DIST)/images
	@e2e/node-tools/images.sh release=$(DIST)/images agent=$(AGENT_BIN) operator=$(STATIC_OPERATOR_BIN) >/dev/null

.PHONY: dist-release
dist-release: dist-chart dist-images ## the chart archive and the images of dist/: what in_cluster.rs installs on the real node

.PHONY: dist-sbom
dist-sbom: sbom-tools ## dist/sbom/orchard-{operator,agent}-VERSION.cdx.json: CycloneDX SBOMs of the shipped Rust programs
	@rm -f $(DIST)/sbom/orchard-operator-*.cdx.json $(DIST)/sbom/orchard-agent-*.cdx.json
	@hack/sbom-rust.sh $(CARGO_CYCLONEDX_ROOT)/bin/cargo-cyclonedx $(DIST)/sbom

.PHONY: dist-sdk
dist-sdk: ## dist/orchard_env-VERSION.tar.gz and -py3-none-any.whl (python -m build, twine check), dist/sbom/orchard-env-python-VERSION.cdx.json
	@sdk_version=$$(sed -n 's/^__version__ = "\(.*\)"/\1/p' sdk/python/src/orchard_env/_version.py); \
	[ "$$sdk_version" = "$(VERSION)" ] || { echo "make dist: the SDK is version $$sdk_version, the workspace $(VERSION)" >&2; exit 1; }
	@bash sdk/python/scripts/dist.sh $(DIST) $(DIST)/sbom >/dev/null

.PHONY: dist
dist: dist-chart dist-images dist-sbom dist-sdk ## the release in dist/: chart .tgz, images, SBOMs, SDK wheel and sdist, checksums.txt (docs/INSTALL.md)
	@$${ORCHARD_DIST_VENV:-$(HOME)/.cache/orchard/dist-venv}/bin/python hack/sbom-validate.py $(DIST)/sbom/*.cdx.json
	@cd $(DIST) && find . -type f ! -name checksums.txt | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum > checksums.txt
	@cd $(DIST) && sha256sum --quiet -c checksums.txt && echo "$(DIST)/checksums.txt: $$(wc -l < checksums.txt) files" && cat checksums.txt

.PHONY: image
image: ## build the operator and agent-injector images (needs docker with a reachable daemon)
	@command -v docker >/dev/null || { echo "make image: no 'docker' command; install a container engine (docker, or podman with DOCKER=podman-docker)" >&2; exit 1; }
	@docker info >/dev/null 2>&1 || { echo "make image: docker cannot reach a daemon ('docker info' failed); start one (this development machine has none)" >&2; exit 1; }
	DOCKER_BUILDKIT=1 docker build -f images/operator.Dockerfile -t $(OPERATOR_IMG) .
	DOCKER_BUILDKIT=1 docker build -f images/agent.Dockerfile -t $(AGENT_IMG) .

.PHONY: kind-up
kind-up: ## create a kind cluster named $(KIND_CLUSTER) (needs kind and docker; not runnable on the dev machines)
	@command -v kind >/dev/null || { echo "make kind-up: 'kind' not found (go install sigs.k8s.io/kind@latest)" >&2; exit 1; }
	@kind get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)' || kind create cluster --name $(KIND_CLUSTER) --wait 120s
	kubectl cluster-info --context kind-$(KIND_CLUSTER)

.PHONY: deploy
deploy: image ## build the images, load them into kind (if KIND_CLUSTER exists) and helm upgrade --install the chart
	@helm=$$($(PACKAGING_TOOLS) | tail -n 1)/helm; \
	if command -v kind >/dev/null && kind get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)'; then \
		kind load docker-image --name $(KIND_CLUSTER) $(OPERATOR_IMG) $(AGENT_IMG); fi; \
	$$helm upgrade --install $(RELEASE) $(CHART) --namespace $(RELEASE_NAMESPACE) --create-namespace \
		--set image.repository=$(OPERATOR_REPO) --set image.tag=$(IMG_TAG) \
		--set agentImage.repository=$(AGENT_REPO) --set agentImage.tag=$(IMG_TAG) \
		--wait --timeout 5m
	kubectl -n $(RELEASE_NAMESPACE) rollout status deploy/$(RELEASE)-operator

.PHONY: undeploy
undeploy: ## helm uninstall the release (the CRDs and your Sandboxes stay: see docs/INSTALL.md)
	@helm=$$($(PACKAGING_TOOLS) | tail -n 1)/helm; \
	$$helm uninstall $(RELEASE) --namespace $(RELEASE_NAMESPACE) --wait

# The scale benchmark: N sandboxes through create -> Ready -> 4 execs -> delete through the gateway.
BENCH_SANDBOXES ?= 1000
BENCH_CONCURRENCY ?= 500
# How often bench-scale runs the batch on one cluster (the doc gives the median and the spread).
BENCH_ROUNDS ?= 3

.PHONY: bench-callgrind
bench-callgrind: k8s agent ## instructions per agent exec, gateway exec and Sandbox life, counted by valgrind's callgrind; writes docs/BENCHMARKS.md
	@e2e/node-tools/debs.sh valgrind=1:3.19.0-1
	$(CARGO) build --release -p orchard-operator -j 2
	ORCHARD_AGENT_BIN=$(abspath $(AGENT_BIN)) ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(CARGO) run --release -p orchard-bench --example bench_callgrind -j 2 -- --write-doc $(abspath docs/BENCHMARKS.md)

.PHONY: bench-scale
bench-scale: k8s agent ## 1,000 sandboxes through create -> Ready -> 4 execs -> delete on the local cluster, 3 rounds; writes docs/BENCHMARKS.md
	$(CARGO) build --release -p orchard-operator -p orchard-testcluster -p orchard-bench --bins -j 2
	ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(TARGET_DIR)/release/bench-scale --sandboxes $(BENCH_SANDBOXES) --concurrency $(BENCH_CONCURRENCY) \
		--rounds $(BENCH_ROUNDS) --write-doc docs/BENCHMARKS.md

# Two operator configurations on the same batch, alternating single-round runs (fresh cluster each):
# `make bench-scale-compare COMPARE_A="--sandbox-concurrency=64" COMPARE_B="--sandbox-concurrency=256"`;
# COMPARE_A_DRIVER / COMPARE_B_DRIVER add bench-scale arguments to one side, e.g. "--concurrency 1000".
COMPARE_A ?= --sandbox-concurrency=64
COMPARE_B ?= --sandbox-concurrency=256
COMPARE_A_DRIVER ?=
COMPARE_B_DRIVER ?=
.PHONY: bench-scale-compare
bench-scale-compare: k8s agent ## bench-scale for operator flags COMPARE_A against COMPARE_B, 3 alternating rounds; prints a Markdown table
	$(CARGO) build --release -p orchard-operator -p orchard-testcluster -p orchard-bench --bins -j 2
	ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator BENCH_SCALE=$(TARGET_DIR)/release/bench-scale \
		python3 bench/examples/bench-scale-compare.py --rounds $(BENCH_ROUNDS) --a="$(COMPARE_A)" --b="$(COMPARE_B)" \
		--a-driver="$(COMPARE_A_DRIVER)" --b-driver="$(COMPARE_B_DRIVER)" \
		-- --sandboxes $(BENCH_SANDBOXES) --concurrency $(BENCH_CONCURRENCY)

.PHONY: bench-queue
bench-queue: k8s agent ## 64 RolloutGroups at once, without and with a RolloutQueue of 128, 3 alternating rounds (time to the last group, sandbox-seconds per group); writes docs/BENCHMARKS.md
	$(CARGO) build --release -p orchard-operator -p orchard-testcluster -p orchard-bench --bins -j 2
	ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(TARGET_DIR)/release/bench-queue --write-doc docs/BENCHMARKS.md

.PHONY: bench-lifecycle
bench-lifecycle: k8s agent ## heartbeat expiry lateness of 100 sandboxes at once, leader takeover after a kill and a cut, operator writes per sandbox; 3 rounds on the hollow node; writes docs/BENCHMARKS.md
	$(CARGO) build --release -p orchard-operator -p orchard-testcluster -p orchard-bench --bins -j 2
	ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(TARGET_DIR)/release/bench-lifecycle --write-doc docs/BENCHMARKS.md

.PHONY: bench-control-plane
bench-control-plane: k8s kwok ## the control plane at scale on 100 KWOK nodes (ramp, 10,000 at 100/s, a burst of 1,000, 1,000 pool claims, expiry of 10,000 at once, 200 RolloutGroups through one queue, 50,000 held and an operator restart; requests per sandbox from an audited cluster); about 35 min after the build; writes docs/BENCHMARKS.md
	$(CARGO) build --release -p orchard-operator -p orchard-bench --bins -j 2
	ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(TARGET_DIR)/release/bench-control-plane --write-doc docs/BENCHMARKS.md

.PHONY: bench-real
bench-real: k8s agent node-images ## the hollow and the real node side by side (1 at a time, 50 at once, 200 with execs; 3 rounds, setups rotating), then warm-pool claims against cold starts (bench-pool); writes docs/BENCHMARKS.md
	$(CARGO) build --release -p orchard-operator -p orchard-testcluster -p orchard-bench --bins -j 2
	ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(TARGET_DIR)/release/bench-real --write-doc docs/BENCHMARKS.md
	ORCHARD_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/orchard-operator \
		$(TARGET_DIR)/release/bench-pool --write-doc docs/BENCHMARKS.md

# The staged pipeline against bounded batches on simulated stage costs (init 2 s CPU, run 10 s GPU, reward 3 s
# CPU, scaled by 1/100): no cluster, about half a minute. The SDK from this checkout (PYTHONPATH), in the SDK venv.
.PHONY: bench-pipeline
bench-pipeline: sdk-venv ## orchard_env.AsyncPipeline vs bounded batches (64 items, 8 GPU and 16 CPU slots, 3 rounds): makespan and simulated GPU idle; no cluster; writes docs/BENCHMARKS.md
	PYTHONPATH=$(abspath sdk/python/src) $(HOME)/.cache/orchard/sdk-venv/bin/python sdk/python/bench/bench_pipeline.py \
		--items 64 --scale 0.01 --gpu 8 --cpu 16 --rounds 3 --write-doc $(abspath docs/BENCHMARKS.md)

.PHONY: bench
bench: bench-agent bench-gateway bench-egress bench-callgrind bench-bar bench-scale bench-queue bench-lifecycle bench-real bench-pipeline ## every benchmark (numbers go to docs/BENCHMARKS.md and docs/BAR.md)

# ---------------------------------------------------------------------------------------------------
# GitOps and observability (issue 18, docs/OPERATIONS.md). kstatus (sigs.k8s.io/cli-utils), luahealth
# (Argo CD's Lua health checks under gopher-lua), promtool (Prometheus v3.16.0), dashlint and promrule
# are built from the pinned Go modules under e2e/tools (GOTOOLCHAIN=local, committed go.sum) into
# $HOME/.cache/orchard/tools/observability, once. `make e2e` builds them first: gitops_status.rs uses
# kstatus and luahealth, hack/manifests-check.sh (manifests_kubeconform.rs) dashlint, promtool, promrule.
OBS_TOOLS := e2e/tools/build.sh

.PHONY: kwok
kwok: ## build KWOK's controller (sigs.k8s.io/kwok v0.8.0, pinned in e2e/tools/kwok) and its fast Stages into ~/.cache/orchard/tools/observability (once)
	@e2e/tools/build.sh kwok >/dev/null

.PHONY: obs-tools
obs-tools: ## build kstatus, luahealth, promtool, dashlint and promrule from pinned Go modules into ~/.cache/orchard/tools/observability (once)
	@$(OBS_TOOLS) >/dev/null

.PHONY: obs-check
obs-check: obs-tools ## Argo CD health checks and kstatus over the recorded objects (no cluster), then the manifests check (dashlint, promtool check/test rules)
	hack/selected-tests.sh 4 $(CARGO) test -p orchard-e2e --test gitops_status -j 2 -- recorded_objects objects_without_status the_argocd_cm_patch the_health_scripts
	@hack/manifests-check.sh

.PHONY: argocd-cm
argocd-cm: ## regenerate config/argocd/argocd-cm-patch.yaml from config/argocd/health-*.lua
	@config/argocd/generate.sh

.PHONY: gitops-fixtures
gitops-fixtures: k8s agent obs-tools ## re-record e2e/tests/fixtures/gitops/*.json from live objects on the local cluster (ORCHARD_RECORD_FIXTURES=1)
	$(CARGO) build -p orchard-operator -j 2
	ORCHARD_RECORD_FIXTURES=1 hack/selected-tests.sh 1 $(CARGO) test -p orchard-e2e --test gitops_status -j 2 -- --skip recorded_objects --skip objects_without_status
	hack/selected-tests.sh 2 $(CARGO) test -p orchard-e2e --test gitops_status -j 2 -- recorded_objects objects_without_status
# --- end of GitOps and observability
