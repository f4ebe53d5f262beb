#!/usr/bin/env bash
# Builds the real node's container images with crane (no Dockerfile, no container engine, no outside
# registry) and keeps each as an OCI image layout under $ORCHARD_IMAGES (default
# $HOME/.cache/orchard/images/<name>/<input hash>/), rebuilt only when its inputs change. The harness
# pushes them into the node's own registry (docs/TESTING.md, "The real node"). With release=DIR it
# builds only the two images a release ships and writes them into DIR (`make dist`, docs/INSTALL.md).
#
#   images.sh agent=BIN pause=BIN probe=BIN [layerfilter=BIN] [operator=BIN]   the real node's images
#   images.sh release=DIR agent=BIN operator=BIN              the release images, exported into DIR
#
# Images (name: what is in it):
#   debian-python  a Debian trixie root filesystem (mmdebstrap, minbase) with python3, git,
#                  ca-certificates, curl and python3-pip
#   debian-chromium  the same kind of root filesystem with chromium, fonts-dejavu-core and python3
#   busybox        only Debian's static busybox and its applet links
#   probe          only one static binary, /orchard-probe: no shell, no libc
#   pause          only /pause: the pod sandbox process (orchard-pause)
#   orchard-agent  only /orchard-agent (the injector image the operator's init container runs)
#   orchard-operator  only /orchard-operator (when operator=BIN is given)
#   orchard-committer  the SandboxSnapshot committer (when layerfilter=BIN is given): Debian's static
#                  busybox and its applets, containerd's `ctr` and `crane` (the node tools' builds),
#                  orchard-layer-filter and the host's CA bundle (docs/SNAPSHOTS.md)
# orchard-agent and orchard-operator carry the OCI labels of a release (version and source from
# Cargo.toml, revision = the git commit, licenses), so the node runs the very images a release ships.
# Release mode writes, for each of the two, DIR/<name>-<version>.tar (docker save-style: `crane push`,
# `docker load`) and DIR/<name>-<version>.oci.tar (the OCI image layout, archived: skopeo's and
# podman's oci-archive), and checks both files: the tarball validates, the archived layout pushes and
# validates, and both hold the same image config.
# Prints one line per image: `<name> <layout dir>`.
set -euo pipefail
USAGE="usage: images.sh agent=BIN pause=BIN probe=BIN [layerfilter=BIN] [operator=BIN] | images.sh release=DIR agent=BIN operator=BIN"
declare -A BIN
RELEASE_DIR=
for arg in "$@"; do
  case "$arg" in
    agent=*|pause=*|probe=*|operator=*|layerfilter=*) BIN[${arg%%=*}]=$(realpath "${arg#*=}") ;;
    release=*) mkdir -p "${arg#*=}" && RELEASE_DIR=$(realpath "${arg#*=}") ;;
    *) echo "$USAGE" >&2; exit 2 ;;
  esac
done
if [ -n "$RELEASE_DIR" ]; then needed=(agent operator); else needed=(agent pause probe); fi
for name in "${needed[@]}"; do
  [ -n "${BIN[$name]:-}" ] && [ -x "${BIN[$name]}" ] || { echo "images.sh: $name=BIN is required and must be executable ($USAGE)" >&2; exit 2; }
done
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
# The release's labels (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
workspace_field() { sed -n "s/^$1 = \"\(.*\)\"/\1/p" "$ROOT/Cargo.toml" | head -n 1; }
VERSION=$(workspace_field version)
REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
LABELS=(
  -l "org.opencontainers.image.version=$VERSION"
  -l "org.opencontainers.image.revision=$REVISION"
  -l "org.opencontainers.image.source=$(workspace_field repository)"
  -l "org.opencontainers.image.licenses=$(workspace_field license)"
)
# The name `docker load` gives a release tarball: the chart's default repository.
RELEASE_REPOSITORY=ghcr.io/orchard-env
if [ -n "$RELEASE_DIR" ]; then
  [ "$REVISION" != unknown ] || { echo "images.sh: release images need the git commit (not a git checkout?)" >&2; exit 1; }
  git -C "$ROOT" diff --quiet HEAD 2>/dev/null ||
    echo "images.sh: warning: uncommitted changes; the images are labelled with commit $REVISION all the same" >&2
fi
TOOLS=$(./build.sh | tail -n 1)
CRANE="$TOOLS/crane"
IMAGES=${ORCHARD_IMAGES:-$HOME/.cache/orchard/images}
DEBIAN_SUITE=trixie
DEBIAN_PACKAGES=python3,git,ca-certificates,curl,python3-pip
DEBIAN_CHROMIUM_PACKAGES=chromium,fonts-dejavu-core,python3
DEBIAN_MIRROR=${ORCHARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$IMAGES"
WORK=$(mktemp -d)
REGISTRY_PID=
cleanup() {
  [ -n "$REGISTRY_PID" ] && kill "$REGISTRY_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# quiet COMMAND...: its output only when it fails (crane logs every blob on stderr).
quiet() { "$@" > "$WORK/quiet.log" 2>&1 || { cat "$WORK/quiet.log" >&2; return 1; }; }

# A throwaway registry on loopback: `crane mutate` works on a registry, not on files.
registry() {
  [ -n "$REGISTRY_PID" ] && return
  # The log exists before the first poll reads it (the background shell may not have opened it yet).
  : > "$WORK/registry.log"
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
    quiet "$CRANE" append --oci-empty-base -f "$layer" -t "$ref"
    quiet "$CRANE" mutate "$ref" --set-platform linux/amd64 "$@" -t "$ref"
    rm -rf "$out.tmp"
    quiet "$CRANE" pull --format=oci "$ref" "$out.tmp"
    mv "$out.tmp" "$out"
    # Older builds of this image are of no use any more.
    find "$IMAGES/$name" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
    echo "images.sh: built $name ($key)" >&2
  fi
  BUILT_LAYOUT=$out
  echo "$name $out"
}

hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

# A layer holding exactly the files under a root directory, owned by root.
layer_of() { tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$1" -cf "$2" .; }

# single_binary NAME BINARY PATH MUTATE_ARGS...: the key covers the binary's content and the image's
# settings (entrypoint, user, labels).
single_binary() {
  local name=$1 binary=$2 path=$3
  shift 3
  local key
  key=$( { sha256sum < "$binary"; printf '%s\n' "$path" "$@"; } | sha256sum | cut -c1-16)
  if [ ! -f "$IMAGES/$name/$key/index.json" ]; then
    mkdir -p "$WORK/$name/$(dirname "$path")"
    install -m 0755 "$binary" "$WORK/$name/$path"
    layer_of "$WORK/$name" "$WORK/$name.tar"
  fi
  build "$name" "$key" "$WORK/$name.tar" "$@"
}

# export_release NAME LAYOUT: NAME-VERSION.tar and NAME-VERSION.oci.tar in RELEASE_DIR, checked.
export_release() {
  local name=$1 layout=$2
  local base="$RELEASE_DIR/$name-$VERSION" ref tag="$RELEASE_REPOSITORY/$name:$VERSION"
  registry
  ref="127.0.0.1:$PORT/$name:$VERSION"
  quiet "$CRANE" push "$layout" "$ref"
  # docker save-style: crane records the throwaway registry's name; the tarball names the chart's
  # default repository instead. Entries in crane's order, without times or owners.
  local unpacked="$WORK/$name.docker"
  mkdir -p "$unpacked"
  "$CRANE" pull "$ref" "$WORK/$name.pulled.tar"
  mapfile -t entries < <(tar -tf "$WORK/$name.pulled.tar")
  tar -xf "$WORK/$name.pulled.tar" -C "$unpacked"
  sed -i "s|\"$ref\"|\"$tag\"|" "$unpacked/manifest.json"
  grep -qF "\"RepoTags\":[\"$tag\"]" "$unpacked/manifest.json" ||
    { echo "images.sh: unexpected manifest.json from crane pull: $(cat "$unpacked/manifest.json")" >&2; exit 1; }
  tar --numeric-owner --owner=0 --group=0 --mode=0644 --mtime=@0 -C "$unpacked" -cf "$base.tar.tmp" "${entries[@]}"
  mv "$base.tar.tmp" "$base.tar"
  # The OCI image layout as it is cached, archived.
  tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$layout" -cf "$base.oci.tar.tmp" .
  mv "$base.oci.tar.tmp" "$base.oci.tar"
  # Check the files as written.
  "$CRANE" validate --tarball "$base.tar" >/dev/null
  mkdir -p "$WORK/$name.oci"
  tar -xf "$base.oci.tar" -C "$WORK/$name.oci"
  quiet "$CRANE" push "$WORK/$name.oci" "$ref-oci"
  "$CRANE" validate --remote "$ref-oci" >/dev/null
  quiet "$CRANE" push "$base.tar" "$ref-docker"
  local config
  config=$("$CRANE" config "$ref-oci")
  [ "$config" = "$("$CRANE" config "$ref-docker")" ] ||
    { echo "images.sh: $base.tar and $base.oci.tar hold different images" >&2; exit 1; }
  grep -qF "\"org.opencontainers.image.revision\":\"$REVISION\"" <<< "$config" ||
    { echo "images.sh: $name has no revision label: $config" >&2; exit 1; }
  echo "images.sh: wrote $base.tar and $base.oci.tar" >&2
}

# The two images a release ships (no command substitution: the registry must stay this shell's).
release_images() {
  single_binary orchard-agent "${BIN[agent]}" /orchard-agent --entrypoint /orchard-agent \
    "${LABELS[@]}" -l org.opencontainers.image.title=orchard-agent
  [ -z "$RELEASE_DIR" ] || export_release orchard-agent "$BUILT_LAYOUT"
  if [ -n "${BIN[operator]:-}" ]; then
    single_binary orchard-operator "${BIN[operator]}" /orchard-operator --entrypoint /orchard-operator \
      -u 65532:65532 "${LABELS[@]}" -l org.opencontainers.image.title=orchard-operator
    [ -z "$RELEASE_DIR" ] || export_release orchard-operator "$BUILT_LAYOUT"
  fi
}

if [ -n "$RELEASE_DIR" ]; then
  release_images
  exit 0
fi
release_images
single_binary pause "${BIN[pause]}" /pause --entrypoint /pause -u 65535:65535
single_binary probe "${BIN[probe]}" /orchard-probe --entrypoint /orchard-probe

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

# orchard-committer: what a SandboxSnapshot's committer Pod runs (its script comes from the operator).
if [ -n "${BIN[layerfilter]:-}" ]; then
  CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
  [ -f "$CA_BUNDLE" ] || { echo "images.sh: $CA_BUNDLE is missing (install ca-certificates)" >&2; exit 1; }
  key=$(hash_of "$BUSYBOX" "$TOOLS/ctr" "$TOOLS/crane" "${BIN[layerfilter]}" "$CA_BUNDLE")
  if [ ! -f "$IMAGES/orchard-committer/$key/index.json" ]; then
    root="$WORK/orchard-committer"
    mkdir -p "$root/bin" "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
    chmod 1777 "$root/tmp"
    install -m 0755 "$BUSYBOX" "$root/bin/busybox"
    for applet in $("$BUSYBOX" --list); do
      [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    install -m 0755 "$TOOLS/ctr" "$TOOLS/crane" "${BIN[layerfilter]}" "$root/usr/local/bin/"
    install -m 0644 "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
    layer_of "$root" "$WORK/orchard-committer.tar"
  fi
  build orchard-committer "$key" "$WORK/orchard-committer.tar" --entrypoint /bin/sh \
    -e PATH=/usr/local/bin:/bin -l org.opencontainers.image.title=orchard-committer
fi

# debian_image NAME PACKAGES: a Debian root filesystem from Debian's mirror (mmdebstrap, minbase, no
# Recommends, without docs, man pages and locales); the key covers the suite, the package list and
# mmdebstrap's version. The slow kind: minutes, once per package list.
debian_image() {
  local name=$1 packages=$2 key
  key=$(printf '%s %s %s %s' "$DEBIAN_SUITE" "$packages" "$(mmdebstrap --version 2>/dev/null)" v1 | sha256sum | cut -c1-16)
  if [ ! -f "$IMAGES/$name/$key/index.json" ]; then
    command -v mmdebstrap >/dev/null || { echo "images.sh: mmdebstrap is not installed (make node-deps)" >&2; exit 1; }
    echo "images.sh: building $name with mmdebstrap ($DEBIAN_SUITE + $packages)" >&2
    mmdebstrap --quiet --variant=minbase --include="$packages" \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      "$DEBIAN_SUITE" "$WORK/$name.tar" "$DEBIAN_MIRROR" >&2
  fi
  build "$name" "$key" "$WORK/$name.tar" --entrypoint /bin/bash \
    -e PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin -e LANG=C.UTF-8
}

# debian-python: python3, git, ca-certificates, curl and python3-pip (~1-2 min cold).
debian_image debian-python "$DEBIAN_PACKAGES"
# debian-chromium: Chromium for GUI agents driven over the DevTools protocol (examples/playwright_gui.py),
# one font for text, python3 to serve pages.
debian_image debian-chromium "$DEBIAN_CHROMIUM_PACKAGES"
