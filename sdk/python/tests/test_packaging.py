"""Packaging metadata (no cluster): one version source, the project URLs and classifiers, and a package
README that works as the PyPI page."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import orchard_env
from orchard_env import _config, _version

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/orchard-env/orchard-env-operator"


def pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_has_one_source() -> None:
    project = pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "orchard_env._version.__version__"}
    assert orchard_env.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]\d+|rc\d+)?", orchard_env.__version__)


def test_metadata_names_the_project() -> None:
    project = pyproject()["project"]
    assert set(project["urls"]) == {"Homepage", "Source", "Documentation", "Issues"}
    assert all(url.startswith(REPOSITORY) for url in project["urls"].values())
    assert project["license"] == "Apache-2.0" and project["authors"] and project["keywords"]
    classifiers = set(project["classifiers"])
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (11, 12, 13)} <= classifiers
    assert "Typing :: Typed" in classifiers
    assert project["requires-python"] == ">=3.11"


def test_the_readme_works_as_the_pypi_page() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", readme)
    assert links and all(link.startswith("https://") for link in links), f"relative links break on PyPI: {links}"
    assert _config.DEFAULT_GATEWAY_URL in readme, "the gateway the client calls by default (the chart's Service)"
    quick_start = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(quick_start.strip().splitlines()) <= 6
    assert "pip install" not in quick_start, "egress is Deny by default"
    assert '"/tmp/hello.py"' in quick_start and 'cwd="/tmp"' in quick_start, "the cwd exists before the command runs"


def test_the_license_text_ships_in_the_sdist_and_the_wheel() -> None:
    project = pyproject()["project"]
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
