#!/usr/bin/env bash
# Builds the observability and GitOps check tools from the pinned Go modules under e2e/tools, once,
# into $ORCHARD_OBS_TOOLS_DIR (default: $HOME/.cache/orchard/tools/observability), and prints that
# directory on stdout (last line) for callers (the Makefile, hack/gitops-check.sh, e2e tests):
#
#   kstatus    e2e/tools/kstatus      sigs.k8s.io/cli-utils kstatus (what Flux reports) of one object
#   luahealth  e2e/tools/luahealth    an Argo CD health Lua script under gopher-lua, as Argo CD runs it
#   promtool   e2e/tools/prometheus   promtool of github.com/prometheus/prometheus (check rules, test rules)
#   dashlint   e2e/tools/prometheus   our Grafana dashboard linter (cmd/dashlint, PromQL parsed by Prometheus)
#   promrule   e2e/tools/prometheus   PrometheusRule -> plain rule file for promtool (cmd/promrule)
#   kwok       e2e/tools/kwok         sigs.k8s.io/kwok's controller: fake nodes and pods for the scale runs
#
# Usage: e2e/tools/build.sh [TOOL...]   (default: all six). Each tool is rebuilt when the hash of its
# module (go.mod, go.sum, our own .go files) changes; later calls return at once. Separate modules, so
# kstatus's client libraries and promtool's never share one dependency graph.
set -euo pipefail
cd "$(dirname "$0")"
PROMETHEUS=v0.316.0 # Prometheus v3.16.0 (the Go module is versioned v0.3MM.P for v3.MM.P)
OUT=${ORCHARD_OBS_TOOLS_DIR:-$HOME/.cache/orchard/tools/observability}
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(kstatus luahealth promtool dashlint promrule kwok)

module_of() {
  case "$1" in
    kstatus) echo kstatus ;;
    luahealth) echo luahealth ;;
    promtool | dashlint | promrule) echo prometheus ;;
    kwok) echo kwok ;;
    *) echo "build.sh: unknown tool $1 (kstatus, luahealth, promtool, dashlint, promrule, kwok)" >&2; exit 2 ;;
  esac
}
hash_of() {
  local module
  module=$(module_of "$1")
  (cd "$module" && cat go.mod go.sum $(find . -name '*.go' | sort)) | sha256sum | cut -c1-16
}
fresh() {
  [ -x "$OUT/$1" ] && [ "$(cat "$OUT/$1.hash" 2>/dev/null)" = "$(hash_of "$1")" ]
}
all_fresh() {
  local tool
  for tool in "${tools[@]}"; do fresh "$tool" || return 1; done
}
if all_fresh; then
  echo "$OUT"
  exit 0
fi
# Parallel callers (test threads, make -j) wait for one build.
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
flock 9
command -v go >/dev/null || { echo "build.sh: Go is required to build ${tools[*]} (go 1.26.x)" >&2; exit 1; }
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly
export GOMODCACHE=${GOMODCACHE_ORCHARD:-$HOME/.cache/orchard/go/mod}
export GOCACHE=${GOCACHE_ORCHARD:-$HOME/.cache/orchard/go/build}
mkdir -p "$GOMODCACHE" "$GOCACHE"
TMP=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
for tool in "${tools[@]}"; do
  fresh "$tool" && continue
  module=$(module_of "$tool")
  start=$(date +%s)
  case "$tool" in
    promtool)
      # remove_all_sd: no service-discovery plugins (cloud SDKs); `check rules` needs none of them.
      (cd "$module" && go build -p 2 -trimpath -tags remove_all_sd \
        -ldflags "-s -w -X github.com/prometheus/common/version.Version=3.${PROMETHEUS#v0.3}" \
        -o "$TMP/$tool" github.com/prometheus/prometheus/cmd/promtool) ;;
    kwok)
      # The controller, and beside it the Stages it plays (no defaults are built in): KWOK's own "fast"
      # pod and node stages and its lease heartbeat, from the same pinned module.
      (cd "$module" && go build -p 2 -trimpath -ldflags "-s -w" -o "$TMP/$tool" sigs.k8s.io/kwok/cmd/kwok)
      stages=$(cd "$module" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
      mkdir -p "$OUT/kwok-stages"
      cp "$stages"/pod/fast/pod-{ready,complete,delete}.yaml "$stages"/node/fast/node-initialize.yaml \
        "$stages"/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml "$OUT/kwok-stages/" ;;
    dashlint | promrule) (cd "$module" && go build -p 2 -trimpath -ldflags "-s -w" -o "$TMP/$tool" "./cmd/$tool") ;;
    *) (cd "$module" && go build -p 2 -trimpath -ldflags "-s -w" -o "$TMP/$tool" .) ;;
  esac
  mv "$TMP/$tool" "$OUT/$tool"
  hash_of "$tool" > "$OUT/$tool.hash"
  echo "built $tool in $(( $(date +%s) - start )) s into $OUT" >&2
done
echo "$OUT"
