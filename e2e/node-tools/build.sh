#!/usr/bin/env bash
# Builds the real node's container runtime and image tool from the pinned Go modules in this directory,
# once, into $ORCHARD_NODE_BIN_DIR (default: $HOME/.cache/orchard/node-tools/<versions>):
#   containerd, containerd-shim-runc-v2, ctr (containerd v2.4.2: Kubernetes 1.36 needs containerd 2.x,
#   Debian bookworm ships 1.6) and crane (go-containerregistry v0.22.1: a local OCI registry and the
#   image assembly, docs/TESTING.md), and kube-router (k3s-io's maintained fork v2.6.3-k3s1, the
#   NetworkPolicy enforcer k3s ships; iptables and ipset; its own module in kube-router/, because
#   upstream kube-router is not served by the Go module proxy and the fork names itself upstream).
# Static (CGO off) with containerd's own build tags for a static build. Later calls return at once.
# Prints the binary directory on stdout (last line).
set -euo pipefail
cd "$(dirname "$0")"
CONTAINERD=v2.4.2
CRANE=v0.22.1
KUBE_ROUTER=v2.6.3-k3s1
OUT=${ORCHARD_NODE_BIN_DIR:-$HOME/.cache/orchard/node-tools/containerd$CONTAINERD-crane$CRANE-kuberouter$KUBE_ROUTER}
BINS=(containerd containerd-shim-runc-v2 ctr crane kube-router)
missing=()
for bin in "${BINS[@]}"; do
  [ -x "$OUT/$bin" ] || missing+=("$bin")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go is required to build containerd and crane (go 1.26.x)" >&2; exit 1; }
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly
export GOMODCACHE=${GOMODCACHE_ORCHARD:-$HOME/.cache/orchard/go/mod}
export GOCACHE=${GOCACHE_ORCHARD:-$HOME/.cache/orchard/go/build}
mkdir -p "$OUT" "$GOMODCACHE" "$GOCACHE"
TMP=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
P=github.com/containerd/containerd/v2
VERSION="-X $P/version.Version=$CONTAINERD"
start=$(date +%s)
echo "building ${missing[*]} into $OUT (cold: ~7 min on 2 cores)" >&2
for bin in "${missing[@]}"; do
  case "$bin" in
    containerd|ctr)
      go build -trimpath -tags "no_btrfs no_devmapper no_zfs osusergo netgo" \
        -ldflags "-s -w $VERSION" -o "$TMP/$bin" "$P/cmd/$bin" ;;
    containerd-shim-runc-v2)
      go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_grpc" \
        -ldflags "-s -w $VERSION" -o "$TMP/$bin" "$P/cmd/$bin" ;;
    crane)
      go build -trimpath -ldflags "-s -w" -o "$TMP/$bin" github.com/google/go-containerregistry/cmd/crane ;;
    kube-router)
      (cd kube-router && go build -trimpath \
        -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER" \
        -o "$TMP/$bin" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router) ;;
  esac
  mv "$TMP/$bin" "$OUT/$bin"
done
echo "built in $(( $(date +%s) - start )) s" >&2
"$OUT/containerd" --version >&2
echo "$OUT"
