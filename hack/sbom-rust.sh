#!/usr/bin/env bash
# CycloneDX SBOMs (JSON, spec 1.5) of the Rust programs a release ships, for `make dist`:
# OUT_DIR/orchard-operator-VERSION.cdx.json and OUT_DIR/orchard-agent-VERSION.cdx.json, each the crate
# with every dependency it is built with for x86_64-unknown-linux-gnu (build dependencies included,
# dev-dependencies not), from Cargo.lock.
#
#   sbom-rust.sh CARGO_CYCLONEDX OUT_DIR
#
# cargo-cyclonedx (pinned by the Makefile, `make sbom-tools`) writes one file next to every workspace
# member's Cargo.toml; this keeps the two shipped ones, removes the rest, and writes bom-refs relative to
# the workspace instead of this checkout's absolute path.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: sbom-rust.sh CARGO_CYCLONEDX OUT_DIR" >&2; exit 2; }
cyclonedx=$1
mkdir -p "$2"
out=$(realpath "$2")
cd "$(dirname "$0")/.."
root=$(pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
name=orchard-dist-sbom
members=$(cargo metadata --no-deps --format-version 1 --offline |
  python3 -c 'import json, os, sys; print("\n".join(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"]))')
cleanup() { while read -r dir; do rm -f "$dir/$name.json"; done <<< "$members"; }
trap cleanup EXIT
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) \
  "$cyclonedx" cyclonedx --quiet --format json --spec-version 1.5 --target x86_64-unknown-linux-gnu \
  --override-filename "$name"
for crate in operator:orchard-operator agent:orchard-agent; do
  dir=${crate%%:*}
  [[ -f "$dir/$name.json" ]] || { echo "sbom-rust.sh: cargo-cyclonedx wrote no $dir/$name.json" >&2; exit 1; }
  sed "s|path+file://$root/|path+file://./|g" "$dir/$name.json" > "$out/${crate#*:}-$version.cdx.json"
done
