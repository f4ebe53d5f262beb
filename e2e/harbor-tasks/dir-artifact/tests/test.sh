#!/bin/bash
cd /app/report 2>/dev/null || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if [ "$(cat summary.txt)" = "3 rows" ] && [ "$(cat latest.csv)" = "$(printf 'n,square\n1,1\n2,4\n3,9')" ] \
   && [ -L latest.csv ] && [ -x bin/show.sh ] && [ "$(bin/show.sh)" = "3 rows" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
