#!/usr/bin/env bash
# The Python SDK's release files (`make dist`, docs/INSTALL.md):
#   OUT_DIR/orchard_env-VERSION.tar.gz and orchard_env-VERSION-py3-none-any.whl: `python -m build`
#     (the sdist, then the wheel from the sdist) from the SDK's tracked files, without build isolation:
#     the pinned setuptools of the tools venv, nothing downloaded per build; `twine check --strict`
#     then checks their metadata, and the wheel must hold the license text;
#   SBOM_DIR/orchard-env-python-VERSION.cdx.json: a CycloneDX SBOM (cyclonedx-py) of the SDK and its
#     runtime dependencies at the versions the tests pin (scripts/test-constraints.txt; the wheel itself
#     requires ranges).
#
#   dist.sh OUT_DIR SBOM_DIR
#
# The tools (build, twine, cyclonedx-bom, setuptools; every transitive package pinned in
# scripts/dist-constraints.txt) live in $HOME/.cache/orchard/dist-venv, the dependencies the SBOM
# describes in $HOME/.cache/orchard/dist-sbom-env; both are created once per pin set (PyPI the first
# time), later runs download nothing.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: dist.sh OUT_DIR SBOM_DIR" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1" "$2"
out="$(realpath "$1")"
sbom_dir="$(realpath "$2")"
tools="${ORCHARD_DIST_VENV:-$HOME/.cache/orchard/dist-venv}"
deps_env="${ORCHARD_DIST_SBOM_ENV:-$HOME/.cache/orchard/dist-sbom-env}"
pins=(build==1.6.1 twine==7.0.0 cyclonedx-bom==7.5.0 setuptools==84.2.1)
constraints="$here/scripts/dist-constraints.txt"
marker="${pins[*]} $(sha256sum < "$constraints" | cut -c1-16)"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
if ! [[ -x "$tools/bin/python" ]] || [[ "$(cat "$tools/.pins" 2>/dev/null)" != "$marker" ]]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check -c "$constraints" "${pins[@]}"
  echo "$marker" > "$tools/.pins"
fi

# Build from the tracked files only (no stray egg-info, caches or local files in the sdist), in a
# copy: setuptools writes build/ and egg-info next to the sources.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
(cd "$here" && git ls-files -z . | tar --null -T - -cf -) | tar -xf - -C "$work/src"
version="$("$tools/bin/python" -c 'import runpy, sys; print(runpy.run_path(sys.argv[1])["__version__"])' \
  "$work/src/src/orchard_env/_version.py")"
rm -f "$out"/orchard_env-* "$sbom_dir"/orchard-env-python-*.cdx.json
# The commit's time as every file's date: the same commit gives the same wheel.
SOURCE_DATE_EPOCH="$(git -C "$here" log -1 --format=%ct)" \
  "$tools/bin/python" -m build --no-isolation --outdir "$work/dist" "$work/src" > "$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; exit 1; }
wheel="orchard_env-$version-py3-none-any.whl"
sdist="orchard_env-$version.tar.gz"
[[ -f "$work/dist/$wheel" && -f "$work/dist/$sdist" ]] ||
  { echo "dist.sh: python -m build wrote $(ls "$work/dist"), not $wheel and $sdist" >&2; exit 1; }
"$tools/bin/twine" --no-color check --strict "$work/dist/$wheel" "$work/dist/$sdist"
"$tools/bin/python" - "$work/dist/$wheel" "$work/dist/$sdist" "$version" <<'EOF'
import sys, tarfile, zipfile
wheel, sdist, version = sys.argv[1:]
names = zipfile.ZipFile(wheel).namelist()
assert f"orchard_env-{version}.dist-info/licenses/LICENSE" in names, f"no LICENSE in the wheel: {names}"
assert f"orchard_env-{version}/LICENSE" in tarfile.open(sdist).getnames(), "no LICENSE in the sdist"
EOF
cp "$work/dist/$wheel" "$work/dist/$sdist" "$out/"

# The runtime dependencies the wheel declares (no extras), installed at the tests' versions.
mapfile -t requires < <("$tools/bin/python" - "$out/$wheel" "$version" <<'EOF'
import sys, zipfile
from email.parser import Parser
wheel, version = sys.argv[1:]
metadata = Parser().parsestr(zipfile.ZipFile(wheel).read(f"orchard_env-{version}.dist-info/METADATA").decode())
for requirement in metadata.get_all("Requires-Dist") or []:
    if "extra ==" not in requirement:
        print(requirement)
EOF
)
test_constraints="$here/scripts/test-constraints.txt"
deps_marker="${requires[*]} $(sha256sum < "$test_constraints" | cut -c1-16)"
if ! [[ -x "$deps_env/bin/python" ]] || [[ "$(cat "$deps_env/.requires" 2>/dev/null)" != "$deps_marker" ]]; then
  rm -rf "$deps_env"
  # Without pip: the environment holds exactly what the SDK needs.
  "$python" -m venv --without-pip "$deps_env"
  "$tools/bin/pip" --python "$deps_env/bin/python" install --quiet --disable-pip-version-check \
    -c "$test_constraints" "${requires[@]}"
  echo "$deps_marker" > "$deps_env/.requires"
fi
sbom="$sbom_dir/orchard-env-python-$version.cdx.json"
SOURCE_DATE_EPOCH="$(git -C "$here" log -1 --format=%ct)" \
  "$tools/bin/cyclonedx-py" environment --pyproject "$here/pyproject.toml" --mc-type library \
  --spec-version 1.5 --output-reproducible --output-file "$sbom" "$deps_env/bin/python"
# The version is dynamic in pyproject.toml (orchard_env/_version.py): cyclonedx-py leaves it out.
"$tools/bin/python" - "$sbom" "$version" <<'EOF'
import json, sys
path, version = sys.argv[1:]
bom = json.load(open(path))
root = bom["metadata"]["component"]
root["version"] = version
root["purl"] = f"pkg:pypi/orchard-env@{version}"
json.dump(bom, open(path, "w"), indent=2)
open(path, "a").write("\n")
EOF
echo "$out/$sdist"
echo "$out/$wheel"
echo "$sbom"
