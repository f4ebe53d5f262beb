#!/bin/bash
set -euo pipefail
printf '%s\n%s\n' "$PWD" "$GREETING" > where.txt
echo "$ANSWER_SUFFIX" >> where.txt
