#!/usr/bin/env bash
# Creates the Python venv of the SDK's tests ($HOME/.cache/orchard/sdk-venv): pinned httpx, pytest and
# pytest-asyncio (and setuptools to build it) from PyPI, plus the SDK itself installed editable from sdk/python. Cached: a second run
# with the same pins only refreshes the editable install.
# The integrations' harnesses (mini-swe-agent, the `minisweagent` extra; SWE-ReX, the `swerex` extra;
# Playwright for Python, which examples/playwright_gui.py drives a sandbox's Chromium with over CDP) are
# pinned separately and
# added to an existing venv without recreating it (recorded in .extras), so checkouts without them
# sharing the venv keep it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ORCHARD_SDK_VENV:-$HOME/.cache/orchard/sdk-venv}"
pins=(httpx==0.28.1 pytest==9.2.0 pytest-asyncio==1.5.0 setuptools==84.2.1)
# Playwright's own browser downloads are never fetched (no `playwright install`): connect_over_cdp
# drives the Chromium inside the sandbox.
extras=(mini-swe-agent==2.4.6 playwright==1.65.2 swe-rex==1.4.0)
# Every transitive dependency pinned too (mini-swe-agent pulls litellm, openai, ...; swe-rex fastapi,
# uvicorn, pexpect, bashlex, ...).
constraints="$here/scripts/test-constraints.txt"
extras_marker="${extras[*]} $(sha256sum "$constraints" | cut -c1-16)"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
if ! [[ -x "$venv/bin/python" ]] || [[ "$(cat "$venv/.pins" 2>/dev/null)" != "${pins[*]}" ]]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -c "$constraints" "${pins[@]}"
  echo "${pins[*]}" > "$venv/.pins"
fi
if [[ "$(cat "$venv/.extras" 2>/dev/null)" != "$extras_marker" ]]; then
  # With the base pins, so the resolver keeps them.
  "$venv/bin/pip" install --quiet --disable-pip-version-check -c "$constraints" "${pins[@]}" "${extras[@]}"
  echo "$extras_marker" > "$venv/.extras"
fi
installed="$(cd / && "$venv/bin/python" -c 'import orchard_env; print(orchard_env.__file__)' 2>/dev/null || true)"
if [[ "$installed" != "$here/src/orchard_env/__init__.py" ]]; then
  # setuptools from the venv (no build isolation: no download at install time).
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$here"
fi
# Wheels of the SDK's dependencies and build backend, for installs without an index (docs/QUICKSTART.md's
# `pip install ./sdk/python` in a fresh venv, run by e2e/tests/docs_run.rs with PIP_NO_INDEX).
wheels="${ORCHARD_WHEELHOUSE:-$HOME/.cache/orchard/wheels}"
wheel_pins=(httpx==0.28.1 setuptools==84.2.1)
if [[ "$(cat "$wheels/.pins" 2>/dev/null)" != "${wheel_pins[*]}" ]]; then
  rm -rf "$wheels"
  mkdir -p "$wheels"
  "$venv/bin/pip" download --quiet --disable-pip-version-check -c "$constraints" --dest "$wheels" "${wheel_pins[@]}"
  echo "${wheel_pins[*]}" > "$wheels/.pins"
fi
echo "sdk venv ready: $venv (${pins[*]} ${extras[*]}, orchard-env from $here; wheels in $wheels)"
