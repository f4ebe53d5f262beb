#!/usr/bin/env bash
# Builds the real node's container images with crane (no Dockerfile, no container engine, no outside
# registry) and keeps each as an OCI image layout under $ORCHARD_IMAGES (default
# $HOME/.cache/orchard/images/<name>/<input hash>/), rebuilt only when its inputs change. The harness
# pushes them into the node's own registry (docs/TESTING.md, "The real node").
#
#   images.sh agent=BIN pause=BIN probe=BIN [operator=BIN]
#
# Images (name: what is in it):
#   debian-python  a Debian trixie root filesystem (mmdebstrap, minbase) with python3 and git
#   busybox        only Debian's static busybox and its applet links
#   probe          only one static binary, /orchard-probe: no shell, no libc
#   pause          only /pause: the pod sandbox process (orchard-pause)
#   orchard-agent  only /orchard-agent (the injector image the operator's init container runs)
#   orchard-operator  only /orchard-operator (when operator=BIN is given)
# Prints one line per image: `<name> <layout dir>`.
set -euo pipefail
declare -A BIN
for arg in "$@"; do
  case "$arg" in
    agent=*|pause=*|probe=*|operator=*) BIN[${arg%%=*}]=$(realpath "${arg#*=}") ;;
    *) echo "usage: images.sh agent=BIN pause=BIN probe=BIN [operator=BIN]" >&2; exit 2 ;;
  esac
done
for needed in agent pause probe; do
  [ -n "${BIN[$needed]:-}" ] && [ -x "${BIN[$needed]}" ] || { echo "images.sh: $needed=BIN is required and must be executable" >&2; exit 2; }
done
cd "$(dirname "$0")"
TOOLS=$(./build.sh | tail -n 1)
CRANE="$TOOLS/crane"
IMAGES=${ORCHARD_IMAGES:-$HOME/.cache/orchard/images}
DEBIAN_SUITE=trixie
DEBIAN_PACKAGES=python3,git,ca-certificates
DEBIAN_MIRROR=${ORCHARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$IMAGES"
WORK=$(mktemp -d)
REGISTRY_PID=
cleanup() {
  [ -n "$REGISTRY_PID" ] && kill "$REGISTRY_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# A throwaway registry on loopback: `crane mutate` works on a registry, not on files.
registry() {
  [ -n "$REGISTRY_PID" ] && return
  "$CRANE" registry serve --address 127.0.0.1:0 > "$WORK/registry.log" 2>&1 &
  REGISTRY_PID=$!
  for _ in $(seq 100); do
    PORT=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$WORK/registry.log" | head -n 1)
    [ -n "$PORT" ] && return
    sleep 0.1
  done
  echo "images.sh: crane registry did not start: $(cat "$WORK/registry.log")" >&2
  exit 1
}

# build NAME KEY LAYER_TAR MUTATE_ARGS...: an image of one layer, unless NAME/KEY exists already.
build() {
  local name=$1 key=$2 layer=$3
  shift 3
  local out="$IMAGES/$name/$key"
  if [ ! -f "$out/index.json" ]; then
    registry
    local ref="127.0.0.1:$PORT/$name:build"
    "$CRANE" append --oci-empty-base -f "$layer" -t "$ref" >/dev/null
    "$CRANE" mutate "$ref" --set-platform linux/amd64 "$@" -t "$ref" >/dev/null
    rm -rf "$out.tmp"
    "$CRANE" pull --format=oci "$ref" "$out.tmp"
    mv "$out.tmp" "$out"
    # Older builds of this image are of no use any more.
    find "$IMAGES/$name" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
    echo "images.sh: built $name ($key)" >&2
  fi
  echo "$name $out"
}

hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

# A layer holding exactly the files under a root directory, owned by root.
layer_of() { tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$1" -cf "$2" .; }

single_binary() {
  local name=$1 binary=$2 path=$3
  shift 3
  local key
  key=$(hash_of "$binary")
  if [ ! -f "$IMAGES/$name/$key/index.json" ]; then
    mkdir -p "$WORK/$name/$(dirname "$path")"
    install -m 0755 "$binary" "$WORK/$name/$path"
    layer_of "$WORK/$name" "$WORK/$name.tar"
  fi
  build "$name" "$key" "$WORK/$name.tar" "$@"
}

single_binary orchard-agent "${BIN[agent]}" /orchard-agent --entrypoint /orchard-agent
single_binary pause "${BIN[pause]}" /pause --entrypoint /pause -u 65535:65535
single_binary probe "${BIN[probe]}" /orchard-probe --entrypoint /orchard-probe
if [ -n "${BIN[operator]:-}" ]; then
  single_binary orchard-operator "${BIN[operator]}" /orchard-operator --entrypoint /orchard-operator -u 65532:65532
fi

# busybox: the static binary and its applet links, nothing else.
BUSYBOX=/bin/busybox
if [ ! -x "$BUSYBOX" ] || ldd "$BUSYBOX" >/dev/null 2>&1; then
  echo "images.sh: $BUSYBOX is missing or not static: install busybox-static (make node-deps)" >&2
  exit 1
fi
key=$(hash_of "$BUSYBOX")
if [ ! -f "$IMAGES/busybox/$key/index.json" ]; then
  mkdir -p "$WORK/busybox/bin" "$WORK/busybox/tmp"
  chmod 1777 "$WORK/busybox/tmp"
  install -m 0755 "$BUSYBOX" "$WORK/busybox/bin/busybox"
  for applet in $("$BUSYBOX" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$WORK/busybox/bin/$applet"
  done
  layer_of "$WORK/busybox" "$WORK/busybox.tar"
fi
build busybox "$key" "$WORK/busybox.tar" --entrypoint /bin/sh -e PATH=/bin

# debian-python: mmdebstrap from Debian's mirror (the slow one: ~1-2 min, once per package list).
key=$(printf '%s %s %s %s' "$DEBIAN_SUITE" "$DEBIAN_PACKAGES" "$(mmdebstrap --version 2>/dev/null)" v1 | sha256sum | cut -c1-16)
if [ ! -f "$IMAGES/debian-python/$key/index.json" ]; then
  command -v mmdebstrap >/dev/null || { echo "images.sh: mmdebstrap is not installed (make node-deps)" >&2; exit 1; }
  echo "images.sh: building the Debian image with mmdebstrap ($DEBIAN_SUITE + $DEBIAN_PACKAGES)" >&2
  mmdebstrap --quiet --variant=minbase --include="$DEBIAN_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$DEBIAN_SUITE" "$WORK/debian.tar" "$DEBIAN_MIRROR" >&2
fi
build debian-python "$key" "$WORK/debian.tar" --entrypoint /bin/bash \
  -e PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin -e LANG=C.UTF-8
