#!/bin/bash
# Reward 1 when /app/answer.txt is allowed.test's answer to /answer (the fake internet names the
# host and the path it served).
if grep -q '^host=allowed.test path=.*/answer ' /app/answer.txt 2>/dev/null; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "answer: $(cat /app/answer.txt 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
