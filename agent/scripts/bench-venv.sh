#!/usr/bin/env bash
# Creates the Python venv of the FastAPI baseline agent used by `make bench-agent` (pinned versions,
# cached under $HOME/.cache/orchard/bench-venv). Only the benchmark uses it.
set -euo pipefail
venv="$HOME/.cache/orchard/bench-venv"
pins=(fastapi==0.115.12 uvicorn==0.34.2)
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import fastapi, uvicorn' 2>/dev/null \
   && [[ "$(cat "$venv/.pins" 2>/dev/null)" == "${pins[*]}" ]]; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}"
echo "${pins[*]}" > "$venv/.pins"
echo "bench venv ready: $venv (${pins[*]})"
