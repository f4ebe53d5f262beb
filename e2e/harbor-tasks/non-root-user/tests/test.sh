#!/bin/bash
# Reward 1 when the agent's file was made by nobody (uid 65534), and says so, and the verifier is root.
owner=$(stat -c %u /tmp/work/owned.txt 2>/dev/null)
if [ "$(id -u)" = 0 ] && [ "$owner" = 65534 ] && [ "$(cat /tmp/work/owned.txt)" = 65534 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "owner=${owner:-none} content=$(cat /tmp/work/owned.txt 2>/dev/null) verifier=$(id -u)"
  echo 0 > /logs/verifier/reward.txt
fi
