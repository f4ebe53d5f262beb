#!/usr/bin/env bash
# Installs the Debian packages the real node needs, at pinned versions, keeping the downloaded .debs in
# $HOME/.cache/orchard/apt so a reinstall needs no download:
#   runc, containernetworking-plugins (bridge, host-local, loopback, portmap), iptables (kubelet and
#   kube-proxy), ipset (kube-router's NetworkPolicy sets), mmdebstrap (the Debian task image),
#   busybox-static (the busybox image), dnsmasq-base and openssl (the tests' fake internet: its DNS
#   server and its CA; dnsmasq-base is the program alone, no system service).
# With arguments (name=version ...), installs those instead (`make bench-callgrind`: valgrind).
# Already installed at the pinned version: returns at once. A pinned version the mirror no longer has
# (Debian replaces point releases) is reported and the mirror's version installed instead.
set -euo pipefail
PACKAGES=(
  "runc=1.1.5+ds1-1+deb12u1"
  "containernetworking-plugins=1.1.1+ds1-3+b5"
  "iptables=1.8.9-2"
  "ipset=7.17-1"
  "mmdebstrap=1.3.5-7"
  "busybox-static=1:1.35.0-4+deb12u1+b1"
  "dnsmasq-base=2.90-4~deb12u2"
  "openssl=3.0.22-1~deb12u2"
)
[ $# -gt 0 ] && PACKAGES=("$@")
CACHE=${ORCHARD_APT_CACHE:-$HOME/.cache/orchard/apt}
wanted=()
for spec in "${PACKAGES[@]}"; do
  name=${spec%%=*}
  version=${spec#*=}
  installed=$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null || true)
  case "$installed" in
    "install ok installed $version") ;;
    "install ok installed "*) echo "debs.sh: $name is installed at ${installed##* }, pinned $version; keeping it" >&2 ;;
    *) wanted+=("$spec") ;;
  esac
done
[ ${#wanted[@]} -eq 0 ] && exit 0
[ "$(id -u)" -eq 0 ] || { echo "debs.sh: installing ${wanted[*]} needs root (apt-get)" >&2; exit 1; }
mkdir -p "$CACHE/partial"
APT=(apt-get -y -q --no-install-recommends -o "Dir::Cache::archives=$CACHE" -o APT::Sandbox::User=root)
export DEBIAN_FRONTEND=noninteractive
echo "debs.sh: installing ${wanted[*]}" >&2
apt-get update -q >&2
if ! "${APT[@]}" install "${wanted[@]}" >&2; then
  names=("${wanted[@]%%=*}")
  echo "debs.sh: the pinned versions are not all on the mirror any more; installing its versions of ${names[*]}" >&2
  "${APT[@]}" install "${names[@]}" >&2
fi
