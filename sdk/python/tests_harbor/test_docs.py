"""The Python block of the Harbor section of docs/HARNESSES.md runs as written, against the fake gateway: Harbor's ``Trial`` with the ``oracle`` agent
prints the reward 1.0."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import httpx
import pytest

from orchard_env.integrations import harbor as integration

from conftest import FAST, NS, FakeGateway
from test_trial import Task, write_task

DOCS = Path(__file__).resolve().parents[3] / "docs"
SECTION = "## Harbor (Terminal-Bench 2.0)\n"


def harbor_section() -> str:
    text = (DOCS / "HARNESSES.md").read_text()
    assert SECTION in text, "docs/HARNESSES.md has a Harbor section"
    return SECTION + text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def test_the_trial_block_of_the_docs_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    section = harbor_section()
    block = section.split("<!-- run by: sdk/python/tests_harbor/test_docs.py", 1)[1].split("```python\n", 1)[1]
    block = block.split("```", 1)[0]
    task = write_task(tmp_path / "tasks")
    assert 'TaskConfig(path="tasks/hello-world")' in block
    block = block.replace('TaskConfig(path="tasks/hello-world")', f'TaskConfig(path="{task}")')
    gateway = FakeGateway()
    gateway.exec = Task(gateway)
    original = integration.AsyncSandboxClient
    monkeypatch.setattr(integration, "AsyncSandboxClient", lambda *a, **k: original(
        *a, transport=httpx.MockTransport(gateway), retry=FAST, **k))
    monkeypatch.setenv("ORCHARD_GATEWAY_URL", "http://gw")
    monkeypatch.setenv("ORCHARD_NAMESPACE", NS)
    monkeypatch.setenv("ORCHARD_TOKEN", "t")
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "HARNESSES.md", "exec"), {"__name__": "docs"})
    assert printed.getvalue().strip().splitlines()[-1] == "1.0"
    assert gateway.created[0]["ttlSeconds"] == 7200 and gateway.deleted
