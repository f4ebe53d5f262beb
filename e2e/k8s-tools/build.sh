#!/usr/bin/env bash
# Builds the upstream Kubernetes binaries the local test clusters run from the pinned Go modules in this
# directory, once, into $ORCHARD_K8S_BIN_DIR (default: $HOME/.cache/orchard/k8s/<versions>):
#   control plane: kube-apiserver, kube-controller-manager, etcd (every cluster);
#   real node:     kubelet, kube-scheduler, kube-proxy (the real-node tests, docs/TESTING.md).
# Later calls return at once. Prints the binary directory on stdout (last line) so callers can
# capture it.
set -euo pipefail
cd "$(dirname "$0")"
K8S=v1.36.3
ETCD=v3.6.13
OUT=${ORCHARD_K8S_BIN_DIR:-$HOME/.cache/orchard/k8s/$K8S-etcd$ETCD}
K8S_COMMANDS=(kube-apiserver kube-controller-manager kubelet kube-scheduler kube-proxy)
missing=()
for bin in "${K8S_COMMANDS[@]}" etcd; do
  [ -x "$OUT/$bin" ] || missing+=("$bin")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go is required to build the local test cluster (go 1.26.x)" >&2; exit 1; }
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly
export GOMODCACHE=${GOMODCACHE_ORCHARD:-$HOME/.cache/orchard/go/mod}
export GOCACHE=${GOCACHE_ORCHARD:-$HOME/.cache/orchard/go/build}
mkdir -p "$OUT" "$GOMODCACHE" "$GOCACHE"
TMP=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
X="-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$K8S -X k8s.io/client-go/pkg/version.gitMajor=1 \
-X k8s.io/client-go/pkg/version.gitMinor=36"
start=$(date +%s)
echo "building ${missing[*]} ($K8S, etcd $ETCD) into $OUT (cold: ~15 min on 2 cores)" >&2
for bin in "${missing[@]}"; do
  if [ "$bin" = etcd ]; then
    go build -trimpath -ldflags "-s -w" -o "$TMP/etcd" go.etcd.io/etcd/server/v3
  else
    go build -trimpath -ldflags "-s -w $X" -o "$TMP/$bin" "k8s.io/kubernetes/cmd/$bin"
  fi
  mv "$TMP/$bin" "$OUT/$bin"
done
echo "built in $(( $(date +%s) - start )) s" >&2
"$OUT/kube-apiserver" --version >&2
echo "$OUT"
