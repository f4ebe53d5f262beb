#!/bin/bash
if [ "$(cat /app/isolated.txt 2>/dev/null)" = isolated ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
