"""The SDK's models read only fields the agent's wire protocol has: every key a model's ``from_json``
reads must be a property of the matching schema in the gateway's ``/openapi.json``, which is generated
from the one definition of the wire types (the ``orchard-api`` crate) that the agent serialises. A field
renamed on either side fails here."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from orchard_env.models import (
    ExecEvent,
    ExecResult,
    FileEntry,
    PatchResult,
    ProcessInfo,
    SessionInfo,
    SessionReadResult,
    SessionRunResult,
    SessionSignalResult,
)

from conftest import Cluster


class Reads(dict[str, Any]):
    """A JSON object that records the keys read from it and holds none."""

    def __init__(self) -> None:
        super().__init__()
        self.keys_read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.keys_read.add(key)
        return default

    def __getitem__(self, key: str) -> Any:
        self.keys_read.add(key)
        raise KeyError(key)


def keys_read(model: Any) -> set[str]:
    data = Reads()
    model.from_json(data)
    return data.keys_read


def properties(document: dict[str, Any], name: str) -> set[str]:
    """The property names of component schema ``name``, through ``$ref`` and ``allOf``/``oneOf``."""
    schemas = document["components"]["schemas"]

    def collect(schema: dict[str, Any]) -> set[str]:
        if "$ref" in schema:
            return collect(schemas[schema["$ref"].rsplit("/", 1)[-1]])
        found = set(schema.get("properties", {}))
        for part in schema.get("allOf", []) + schema.get("oneOf", []) + schema.get("anyOf", []):
            found |= collect(part)
        return found

    return collect(schemas[name])


@pytest.fixture(scope="module")
def document(cluster: Cluster) -> dict[str, Any]:
    response = httpx.get(f"{cluster.gateway}/openapi.json", timeout=30)
    response.raise_for_status()
    return response.json()


@pytest.mark.parametrize(
    ("model", "schema"),
    [
        (ExecResult, "ExecResponse"),
        (ExecEvent, "ExecEvent"),
        (ProcessInfo, "ProcessStatus"),
        (FileEntry, "FileEntry"),
        (PatchResult, "PatchResult"),
        (SessionInfo, "SessionStatus"),
        (SessionRunResult, "SessionRunResponse"),
        (SessionReadResult, "SessionReadResponse"),
        (SessionSignalResult, "SessionSignalResponse"),
    ],
)
def test_models_read_only_fields_of_the_wire_protocol(document: dict[str, Any], model: Any, schema: str) -> None:
    read = keys_read(model)
    assert read, f"{model.__name__}.from_json reads nothing: the check would be empty"
    unknown = read - properties(document, schema)
    assert not unknown, f"{model.__name__} reads {sorted(unknown)}, which {schema} of /openapi.json does not have"
