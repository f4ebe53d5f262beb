#!/bin/bash
set -euo pipefail
mkdir -p /tmp/work
id -u > /tmp/work/owned.txt
