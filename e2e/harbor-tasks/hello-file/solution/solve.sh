#!/bin/bash
set -euo pipefail
printf 'hello, orchard\n' > /app/hello.txt
