#!/bin/bash
# Fails (and writes nothing) when allowed.test answers, through the proxy variables (the egress proxy
# refuses a no-network sandbox with 403: -f makes that a failure) or around them.
set -u
if curl -fs -o /dev/null --connect-timeout 3 --max-time 5 http://allowed.test/; then
  echo "allowed.test answered through the proxy" >&2; exit 1
fi
if curl -fs -o /dev/null --noproxy '*' --connect-timeout 3 --max-time 5 http://allowed.test/; then
  echo "allowed.test answered directly" >&2; exit 1
fi
echo isolated > /app/isolated.txt
