#!/bin/bash
expected=$(printf '/srv/task\nhello from task.toml\nfrom the solution')
if [ "$(cat /srv/task/where.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "where.txt: $(cat /srv/task/where.txt 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
