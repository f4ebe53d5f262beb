#!/bin/bash
# Reward 1 when the agent ran after the health check needed its three tries.
if [ "$(cat /app/status.txt 2>/dev/null)" = started ] && [ "$(cat /tmp/health-tries)" -ge 3 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "tries=$(cat /tmp/health-tries 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
