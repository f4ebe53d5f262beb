#!/bin/bash
set -euo pipefail
echo saved > /app/partial.txt
# A child that would outlive the agent phase if the time-out killed only this shell.
sleep 600 &
wait
