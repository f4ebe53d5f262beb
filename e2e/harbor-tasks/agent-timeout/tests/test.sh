#!/bin/bash
# Reward 1 when the answer was saved and nothing of the timed-out phase runs any more (its whole
# process group was killed, not only the script's shell).
left=""
for f in /proc/[0-9]*/cmdline; do
  if [ "$(tr '\0' ' ' < "$f" 2>/dev/null)" = "sleep 600 " ]; then left="$left $f"; fi
done
if [ "$(cat /app/partial.txt 2>/dev/null)" = saved ] && [ -z "$left" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "partial=$(cat /app/partial.txt 2>&1) left=$left"
  echo 0 > /logs/verifier/reward.txt
fi
