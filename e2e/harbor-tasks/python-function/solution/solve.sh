#!/bin/bash
set -euo pipefail
cat > /app/primes.py <<'PY'
def primes(n):
    """The prime numbers below n."""
    sieve = [True] * max(n, 0)
    found = []
    for i in range(2, n):
        if sieve[i]:
            found.append(i)
            for j in range(i * i, n, i):
                sieve[j] = False
    return found
PY
