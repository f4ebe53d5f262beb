#!/usr/bin/env bash
# Creates the Python venv of the Harbor integration ($HOME/.cache/orchard/harbor-venv): Harbor 0.25.0
# (Terminal-Bench 2.0's framework, which needs Python >= 3.12) with every transitive dependency pinned by
# scripts/harbor-constraints.txt, pytest and pytest-asyncio for tests_harbor/, and the SDK itself installed
# editable from sdk/python (orchard_env.integrations.harbor). Cached: a second run with the same pins and
# constraints only refreshes the editable install. Apart from the SDK venv (scripts/venv.sh, Python 3.11),
# whose tests never import Harbor.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ORCHARD_HARBOR_VENV:-$HOME/.cache/orchard/harbor-venv}"
pins=(harbor==0.25.0 httpx==0.28.1 pytest==9.2.0 pytest-asyncio==1.5.0 setuptools==84.2.1)
constraints="$here/scripts/harbor-constraints.txt"
marker="${pins[*]} $(sha256sum "$constraints" | cut -c1-16)"
# Python 3.12: PYTHON, else python3.12 on PATH, else pyenv's newest 3.12.
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if command -v python3.12 >/dev/null 2>&1 && python3.12 -c '' 2>/dev/null; then
    python=python3.12
  else
    python="$(ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python3.12 2>/dev/null | sort -V | tail -n 1)"
  fi
fi
if [[ -z "$python" ]] || ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
  echo "harbor-venv: Harbor 0.25.0 needs Python 3.12 (set PYTHON=/path/to/python3.12)" >&2
  exit 1
fi
if ! [[ -x "$venv/bin/python" ]] || [[ "$(cat "$venv/.pins" 2>/dev/null)" != "$marker" ]]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -c "$constraints" "${pins[@]}"
  echo "$marker" > "$venv/.pins"
fi
installed="$(cd / && "$venv/bin/python" -c 'import orchard_env; print(orchard_env.__file__)' 2>/dev/null || true)"
if [[ "$installed" != "$here/src/orchard_env/__init__.py" ]]; then
  # setuptools from the venv (no build isolation: no download at install time).
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$here"
fi
echo "harbor venv ready: $venv ($("$venv/bin/python" --version), ${pins[*]}, orchard-env from $here)"
