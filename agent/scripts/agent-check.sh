#!/usr/bin/env bash
# Proves the static orchard-agent runs in an empty root: a temp dir holding only the binary is the
# chroot; inside it `--version` runs, then `serve` on a free loopback port answers /healthz (curl from
# outside) and execs the agent itself. Needs root (chroot).
set -euo pipefail
bin=${1:?usage: agent-check.sh PATH-TO-STATIC-AGENT}
if [[ $(id -u) -ne 0 ]]; then echo "agent-check: chroot needs root" >&2; exit 1; fi
if file "$bin" | grep -q 'dynamically linked'; then echo "agent-check: $bin is dynamically linked" >&2; exit 1; fi
echo "orchard-agent: $(stat -c %s "$bin") bytes, $(file -b "$bin" | cut -d, -f1-5)"
root=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$root"; }
trap cleanup EXIT
cp "$bin" "$root/orchard-agent"
echo "chroot contents: $(ls -A "$root")"
chroot "$root" /orchard-agent --version
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
chroot "$root" /orchard-agent serve --listen "127.0.0.1:$port" --root / --insecure-no-auth &
pid=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
echo "healthz: $(curl -sf "http://127.0.0.1:$port/healthz")"
out=$(curl -sf -X POST "http://127.0.0.1:$port/v1/exec" -H 'Content-Type: application/json' \
  -d '{"argv":["/orchard-agent","--version"]}')
echo "exec: $out"
if ! grep -q '"exitCode":0' <<<"$out" || ! grep -q '"stdout":"orchard-agent ' <<<"$out"; then
  echo "agent-check: exec inside the empty root failed" >&2
  exit 1
fi
echo "agent-check: OK (static binary serves and execs in an empty root)"
