#!/usr/bin/env bash
# Builds the packaging tools from the pinned Go modules in this directory, once, into
# $ORCHARD_TOOLS_BIN_DIR (default: $HOME/.cache/orchard/tools/<versions>): helm, kubeconform, and our
# own openapi2schema (cmd/openapi2schema: OpenAPI/CRD -> kubeconform schemas; rebuilt when its source
# changes). Later calls return at once. Prints the binary directory on stdout (last line) so callers
# (the Makefile, e2e tests) can capture it.
#
# Kept apart from e2e/k8s-tools on purpose: that module's graph must stay Kubernetes + etcd only, and
# helm pulls a different (newer) client-go than the kube-apiserver we run.
set -euo pipefail
cd "$(dirname "$0")"
HELM=v3.22.0
KUBECONFORM=v0.8.0
OUT=${ORCHARD_TOOLS_BIN_DIR:-$HOME/.cache/orchard/tools/helm-$HELM-kubeconform-$KUBECONFORM}
SCHEMAGEN_HASH=$(cat go.mod go.sum cmd/openapi2schema/*.go | sha256sum | cut -c1-16)
built() {
  [ -x "$OUT/helm" ] && [ -x "$OUT/kubeconform" ] && [ -x "$OUT/openapi2schema" ] &&
    [ "$(cat "$OUT/openapi2schema.hash" 2>/dev/null)" = "$SCHEMAGEN_HASH" ]
}
if built; then
  echo "$OUT"
  exit 0
fi
# Parallel callers (test threads, make -j) wait for one build instead of each compiling helm.
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
flock 9
if built; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go is required to build helm and kubeconform (go 1.26.x)" >&2; exit 1; }
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly
export GOMODCACHE=${GOMODCACHE_ORCHARD:-$HOME/.cache/orchard/go/mod}
export GOCACHE=${GOCACHE_ORCHARD:-$HOME/.cache/orchard/go/build}
mkdir -p "$OUT" "$GOMODCACHE" "$GOCACHE"
TMP=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# Helm's own Makefile stamps its version and the Kubernetes version of its client-go into the binary;
# without the latter `helm template` would claim Kubernetes v1.20 in .Capabilities.
client_go=$(go list -m -f '{{.Version}}' k8s.io/client-go) # v0.MINOR.PATCH
k8s_minor=$(echo "$client_go" | cut -d. -f2)
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM \
-X helm.sh/helm/v3/internal/version.gitTreeState=clean \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"

if [ ! -x "$OUT/helm" ] || [ ! -x "$OUT/kubeconform" ]; then
  start=$(date +%s)
  echo "building helm $HELM and kubeconform $KUBECONFORM into $OUT (cold: ~3 min on 2 cores)" >&2
  go build -p 2 -trimpath -ldflags "$helm_ldflags" -o "$TMP/helm" helm.sh/helm/v3/cmd/helm
  helm_done=$(date +%s)
  go build -p 2 -trimpath -ldflags "-s -w -X main.version=$KUBECONFORM" -o "$TMP/kubeconform" \
    github.com/yannh/kubeconform/cmd/kubeconform
  end=$(date +%s)
  mv "$TMP/helm" "$TMP/kubeconform" "$OUT/"
  echo "built helm in $(( helm_done - start )) s, kubeconform in $(( end - helm_done )) s" >&2
fi
go build -p 2 -trimpath -ldflags "-s -w" -o "$TMP/openapi2schema" ./cmd/openapi2schema
mv "$TMP/openapi2schema" "$OUT/"
echo "$SCHEMAGEN_HASH" > "$OUT/openapi2schema.hash"
echo "$("$OUT/helm" version --short), kubeconform $("$OUT/kubeconform" -v), openapi2schema $SCHEMAGEN_HASH" >&2
echo "$OUT"
