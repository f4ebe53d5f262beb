#!/bin/bash
# Reward 1 when /app/primes.py's primes(n) is right for a few n.
cat > /tmp/test_primes.py <<'PY'
import sys
sys.path.insert(0, "/app")
from primes import primes

assert primes(10) == [2, 3, 5, 7], primes(10)
assert primes(2) == [] and primes(0) == [] and primes(3) == [2]
assert len(primes(10_000)) == 1229
print("ok")
PY
if python3 /tmp/test_primes.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
