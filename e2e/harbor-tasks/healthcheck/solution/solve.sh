#!/bin/bash
set -euo pipefail
echo started > /app/status.txt
