#!/bin/bash
set -euo pipefail
curl -fsS --max-time 20 http://allowed.test/answer -o /app/answer.txt
