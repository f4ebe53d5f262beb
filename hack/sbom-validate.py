"""`make dist`: every SBOM in dist/sbom validates against the CycloneDX 1.5 JSON schema (strict), with
the pinned cyclonedx-python-lib of the release tools' venv (sdk/python/scripts/dist.sh)."""

import sys

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

validator = JsonStrictValidator(SchemaVersion.V1_5)
failed = False
for path in sys.argv[1:]:
    with open(path) as sbom:
        error = validator.validate_str(sbom.read())
    if error is not None:
        print(f"{path}: not a valid CycloneDX 1.5 SBOM: {error}", file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)
