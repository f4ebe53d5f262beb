"""The sync and async clients have the same surface: for each class pair, the same public methods and
properties, the same signatures (parameter names, kinds, defaults and annotations, the async classes'
names and ``AsyncIterator`` read as the sync ones) and the same docstrings (after reading "await x" as
"x", "async with"/"async for"/"async iterator" as "with"/"for"/"iterator"). Every public method of both
has a docstring, and every async one is a coroutine (or async generator) function.

Deliberate differences are listed below with their reason; anything else fails with a readable diff."""

from __future__ import annotations

import difflib
import inspect
import re
import textwrap
from typing import Any

import pytest

from orchard_env import (
    AsyncProcess,
    AsyncRolloutGroup,
    AsyncSandbox,
    AsyncSandboxClient,
    AsyncSession,
    AsyncSnapshot,
    Process,
    RolloutGroup,
    Sandbox,
    SandboxClient,
    Session,
    Snapshot,
)

PAIRS = [
    (SandboxClient, AsyncSandboxClient), (Sandbox, AsyncSandbox), (Process, AsyncProcess), (Session, AsyncSession),
    (RolloutGroup, AsyncRolloutGroup), (Snapshot, AsyncSnapshot),
]

#: Public members only one side has: (class, name) -> why.
ONE_SIDED: dict[tuple[str, str], str] = {
    ("AsyncSandboxClient", "aclose"): "the asyncio spelling (as httpx.AsyncClient.aclose); close() is its alias, as in the sync client",
}

#: Parts of a signature that may differ: (sync class, method) -> {parameter name, or "return": why}.
SIGNATURE_DIFFERENCES: dict[tuple[str, str], dict[str, str]] = {
    ("SandboxClient", "create"): {
        "return": "the async create answers an awaitable of the handle that is also an async context manager "
        "(`async with client.create(...) as sbx`), so it is not a coroutine function either",
    },
    ("Sandbox", "session"): {
        "return": "as create: the async session answers an awaitable of the handle that is also an async context "
        "manager (`async with sbx.session() as sh`)",
    },
    ("RolloutGroup", "drive"): {
        "episode": "the async episode may be a coroutine function (or a plain one): Awaitable[EpisodeResult] | EpisodeResult",
    },
}

#: Async methods that are plain functions on purpose: (async class, method) -> why.
NOT_COROUTINES: dict[tuple[str, str], str] = {
    ("AsyncSandboxClient", "create"): "answers an awaitable that is also an async context manager (see above)",
    ("AsyncSandboxClient", "rollout_group"): "makes a handle without any I/O, as the sync one",
    ("AsyncSandbox", "session"): "answers an awaitable that is also an async context manager (see above)",
    ("AsyncSandbox", "forward_port"): "makes the forward without I/O; `async with` opens its listener",
}

#: Docstring text that may differ: (sync class, method) -> [(async text, sync text, why)]; the async
#: text is replaced by the sync one before comparing, everything else must be the same.
DOCSTRING_DIFFERENCES: dict[tuple[str, str], list[tuple[str, str, str]]] = {
    ("SandboxClient", "create"): [(
        "Await it for the handle, or use it as ``async with client.create(...) as sbx:``.",
        "Returns its handle, a context manager: ``with client.create(...) as sbx:``.",
        "the async create answers an awaitable (see SIGNATURE_DIFFERENCES)",
    )],
    ("Sandbox", "session"): [(
        "Await it for the handle, or use it as ``async with sbx.session() as sh:``, which closes the session "
        "at the end of the block.",
        "Returns its handle, a context manager: ``with sbx.session() as sh:`` closes the session at the end "
        "of the block.",
        "the async session answers an awaitable (see SIGNATURE_DIFFERENCES)",
    )],
    ("Sandbox", "forward_port"): [(
        "``async with sbx.forward_port(9222) as local_port:``",
        "``with sbx.forward_port(9222) as local_port:``",
        "the async forward is an async context manager",
    )],
    ("Sandbox", "stop_heartbeats"): [(
        "cancels the background task",
        "stops the background thread, waiting at most 5 s for it",
        "heartbeats run in a thread per handle in the sync client, as a task in the async one",
    )],
    ("RolloutGroup", "drive"): [
        (
            "runs ``await episode(sandbox)`` (a coroutine function, or a plain one) as a task",
            "runs ``episode(sandbox)`` in a worker thread",
            "episodes run in worker threads in the sync client, as tasks in the async one, which also takes plain functions",
        ),
        ("are cancelled", "are waited for", "threads cannot be cancelled, tasks can (docs/SDK.md says so too)"),
        ("(cancelling the task,", "(``KeyboardInterrupt``,", "how each kind of caller interrupts drive()"),
    ],
}

ASYNC_NAMES = re.compile(r"\bAsync(SandboxClient|Sandbox|Process|Session|RolloutGroup|Snapshot)\b")


def normalise_annotation(text: Any) -> str:
    text = ASYNC_NAMES.sub(r"\1", str(text))
    return re.sub(r"\bAsyncIterator\[", "Iterator[", text)


def normalise_doc(text: str) -> str:
    text = ASYNC_NAMES.sub(r"\1", text)
    text = re.sub(r"\bawait\s+", "", text)
    text = re.sub(r"\basync\s+(?=with\b|for\b|iterator\b|def\b)", "", text)
    return " ".join(text.split())


def public(cls: type) -> dict[str, Any]:
    """Public methods and properties of ``cls`` (inherited ones included), undecorated."""
    members = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, (property, staticmethod, classmethod)) or inspect.isfunction(member):
            members[name] = member
    return members


def doc_of(member: Any) -> str:
    return inspect.cleandoc(member.__doc__ or "") if not isinstance(member, property) else inspect.cleandoc(member.fget.__doc__ or "")


def parameters(function: Any) -> dict[str, str]:
    """Each parameter (and ``return``) as ``kind, default, annotation`` text, async names read as sync."""
    signature = inspect.signature(function)
    found = {
        p.name: f"{p.kind.name.lower()}, default {'-' if p.default is p.empty else repr(p.default)}, "
        f"annotation {normalise_annotation(p.annotation)}"
        for p in signature.parameters.values()
    }
    found["return"] = normalise_annotation(signature.return_annotation)
    return found


def sentences(text: str) -> list[str]:
    return textwrap.wrap(text, 100)


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_the_async_class_has_the_sync_ones_surface(sync: type, aio: type) -> None:
    problems: list[str] = []
    ours, theirs = public(sync), public(aio)
    for name in sorted(set(ours) ^ set(theirs)):
        owner = sync if name in ours else aio
        if (owner.__name__, name) not in ONE_SIDED:
            problems.append(f"{owner.__name__}.{name} has no counterpart in {(aio if owner is sync else sync).__name__}")
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        where = f"{sync.__name__}.{name} / {aio.__name__}.{name}"
        for owner, member in ((sync, a), (aio, b)):
            if not doc_of(member):
                problems.append(f"{owner.__name__}.{name} has no docstring")
        if isinstance(a, property) or isinstance(b, property):
            if not (isinstance(a, property) and isinstance(b, property)):
                problems.append(f"{where}: a property on one side only")
        else:
            allowed = SIGNATURE_DIFFERENCES.get((sync.__name__, name), {})
            pa, pb = parameters(a), parameters(b)
            for key in sorted(set(pa) | set(pb), key=lambda k: (k == "return", list(pa).index(k) if k in pa else 99)):
                if pa.get(key) != pb.get(key) and key not in allowed:
                    problems.append(f"{where}: {key}: sync ({pa.get(key, 'missing')}) != async ({pb.get(key, 'missing')})")
            if inspect.iscoroutinefunction(a) or inspect.isasyncgenfunction(a):
                problems.append(f"{sync.__name__}.{name} is async in the sync client")
            if not (inspect.iscoroutinefunction(b) or inspect.isasyncgenfunction(b)) and (aio.__name__, name) not in NOT_COROUTINES:
                problems.append(f"{aio.__name__}.{name} is not a coroutine function")
        doc_a, doc_b = normalise_doc(doc_of(a)), normalise_doc(doc_of(b))
        for async_text, sync_text, _why in DOCSTRING_DIFFERENCES.get((sync.__name__, name), []):
            if normalise_doc(async_text) not in doc_b:
                problems.append(f"stale DOCSTRING_DIFFERENCES entry for {where}: {async_text!r}")
            doc_b = doc_b.replace(normalise_doc(async_text), normalise_doc(sync_text))
        if doc_a != doc_b:
            diff = "\n".join(difflib.unified_diff(sentences(doc_a), sentences(doc_b), sync.__name__, aio.__name__, lineterm=""))
            problems.append(f"{where}: docstrings differ:\n{diff}")
    assert not problems, "\n".join(problems)


def test_the_allow_lists_name_real_members() -> None:
    classes = {cls.__name__: cls for pair in PAIRS for cls in pair}
    for entries in (ONE_SIDED, SIGNATURE_DIFFERENCES, NOT_COROUTINES, DOCSTRING_DIFFERENCES):
        for owner, name in entries:
            assert name in public(classes[owner]), f"allow-list entry {owner}.{name} names nothing"
