# Orchard Env operator: every entry point. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
HOST_TRIPLE := x86_64-unknown-linux-gnu
# The agent is linked statically against glibc (crt-static): there is no musl target on this machine.
AGENT_BIN := $(TARGET_DIR)/$(HOST_TRIPLE)/agent/orchard-agent

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sort

.PHONY: build
build: agent ## build the operator, crdgen, bar-sim and the static agent
	$(CARGO) build --release -p orchard-operator

.PHONY: agent
agent: ## build the static orchard-agent binary (glibc crt-static)
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --profile agent -p orchard-agent --target $(HOST_TRIPLE)
	@ls -l $(AGENT_BIN) | awk '{printf "orchard-agent: %s bytes\n", $$5}'

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
	$(CARGO) test -p orchard-operator --lib -j 2 -- bar:: bar_sim::

.PHONY: bench-bar
bench-bar: ## run the seeded BAR simulator; writes docs/bar-sim.json and the results section of docs/BAR.md
	$(CARGO) run --release -p orchard-operator --bin bar-sim -j 2 -- $(BAR_SIM_ARGS) \
		--out-json docs/bar-sim.json --out-md docs/BAR.md

.PHONY: crds
crds: ## regenerate crds/*.yaml from the Rust types
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandbox > crds/sandboxes.orchard.dev.yaml
	$(CARGO) run -q -p orchard-operator --bin crdgen -- rolloutgroup > crds/rolloutgroups.orchard.dev.yaml

.PHONY: crds-check
crds-check: ## fail if crds/ differs from what the Rust types generate
	@tmp=$$(mktemp -d); \
	$(CARGO) run -q -p orchard-operator --bin crdgen -- sandbox > $$tmp/sandboxes.orchard.dev.yaml && \
	$(CARGO) run -q -p orchard-operator --bin crdgen -- rolloutgroup > $$tmp/rolloutgroups.orchard.dev.yaml && \
	if ! diff -u crds/sandboxes.orchard.dev.yaml $$tmp/sandboxes.orchard.dev.yaml || ! diff -u crds/rolloutgroups.orchard.dev.yaml $$tmp/rolloutgroups.orchard.dev.yaml; then \
		echo "crds/ is out of date: run 'make crds' and commit the result" >&2; rm -rf $$tmp; exit 1; fi; \
	rm -rf $$tmp; echo "crds/ matches the Rust types"

.PHONY: lint
lint: ## rustfmt check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
