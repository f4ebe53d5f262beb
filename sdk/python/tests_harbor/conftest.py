"""A fake Orchard gateway for the Harbor environment's tests (no cluster): an ``httpx.MockTransport``
handler that keeps sandboxes, plays their agent (exec through a per-test handler, files in an in-memory
file system with modes and symlinks, directories as tar streams) and records every request.

These tests need Harbor (Python >= 3.12): they run in the Harbor venv (``make test-harbor``), apart from
``sdk/python/tests``, which the SDK venv (Python 3.11) runs against the local cluster."""

from __future__ import annotations

import io
import json
import posixpath
import shlex
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from orchard_env import AsyncSandboxClient, RetryPolicy, _cleanup

#: Retries without waiting, for the fake gateway.
FAST = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002)
NS = "ns"
BASE = f"/v1/namespaces/{NS}/sandboxes"


def exec_answer(stdout: str = "", stderr: str = "", exit_code: int | None = 0, *, timed_out: bool = False,
                signal: int | None = None, oom_killed: bool = False, **extra: Any) -> dict[str, Any]:
    """The agent's answer of ``POST /v1/exec``."""
    return {"exitCode": exit_code, "signal": signal, "timedOut": timed_out, "oomKilled": oom_killed,
            "stdout": stdout, "stderr": stderr, "stdoutTruncated": False, "stderrTruncated": False,
            "durationMs": 3, "outputEncoding": "text", **extra}


def error(status: int, code: str, message: str, **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": message, "retryable": False, **extra})


@dataclass
class Node:
    """One entry of the fake file system."""

    type: str  # file, directory, symlink
    data: bytes = b""
    mode: int = 0o644
    target: str = ""


@dataclass
class FakeGateway:
    """The gateway of namespace ``ns``. ``outcome`` is the status a created sandbox settles in (Ready by
    default); ``exec`` answers each exec body (default: :meth:`shell`, which knows ``test -d``/``test -f``
    and ``pwd``); ``network_answer`` answers ``PUT .../network``; ``create_error`` refuses creates."""

    outcome: dict[str, Any] = field(default_factory=lambda: {"phase": "Ready", "conditions": [
        {"type": "Ready", "status": "True", "reason": "SandboxReady", "message": ""}]})
    exec: Callable[[dict[str, Any]], dict[str, Any] | httpx.Response] | None = None
    network_answer: dict[str, Any] | None = None
    create_error: httpx.Response | None = None
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    fs: dict[str, Node] = field(default_factory=lambda: {"/": Node("directory", mode=0o755)})
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    execs: list[dict[str, Any]] = field(default_factory=list)
    setup_execs: list[dict[str, Any]] = field(default_factory=list)
    created: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    networks: list[dict[str, Any]] = field(default_factory=list)
    cwd: str = "/app"

    # -- the file system ---------------------------------------------------------------------------

    def put(self, path: str, node: Node) -> None:
        path = posixpath.normpath(path)
        parent = posixpath.dirname(path)
        while parent not in self.fs:
            self.fs[parent] = Node("directory", mode=0o755)
            parent = posixpath.dirname(parent)
        self.fs[path] = node

    def write(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self.put(path, Node("file", data.encode() if isinstance(data, str) else data, mode))

    def under(self, root: str) -> list[tuple[str, Node]]:
        root = posixpath.normpath(root)
        prefix = root.rstrip("/") + "/"
        return sorted((p[len(prefix):], n) for p, n in self.fs.items() if p.startswith(prefix))

    def shell(self, body: dict[str, Any]) -> dict[str, Any]:
        """A few commands, enough for Harbor's own helpers: ``test -d``/``test -f``, ``pwd``, ``mkdir -p``."""
        script = body["argv"][-1]
        words = shlex.split(script.split("&&")[0]) if script.startswith("mkdir") else script.split()
        if words[:1] == ["test"] and len(words) == 3:
            node = self.fs.get(posixpath.normpath(words[2].strip("'")))
            kind = {"-d": "directory", "-f": "file"}[words[1]]
            return exec_answer(exit_code=0 if node is not None and node.type == kind else 1)
        if script == "pwd":
            return exec_answer(f"{body.get('cwd') or self.cwd}\n")
        if words[:2] == ["mkdir", "-p"]:
            for path in words[2:]:
                if path != "--":
                    self.put(path, Node("directory", mode=0o755))
        return exec_answer()

    # -- the handler ---------------------------------------------------------------------------------

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        params = dict(request.url.params)
        body: Any = None
        if request.headers.get("content-type") == "application/json" and request.content:
            body = json.loads(request.content)
        self.requests.append((request.method, path, params, body))
        if not path.startswith(BASE):
            return error(404, "NotFound", f"no route {path}")
        rest = path[len(BASE):]
        if rest == "" and request.method == "POST":
            return self.create(body)
        name, _, route = rest.lstrip("/").partition("/")
        sandbox = self.sandboxes.get(name)
        if sandbox is None:
            return error(404, "NotFound", f"sandbox {NS}/{name} not found")
        if route == "" and request.method == "GET":
            return httpx.Response(200, json=sandbox)
        if route == "" and request.method == "DELETE":
            self.deleted.append(name)
            del self.sandboxes[name]
            return httpx.Response(200, json={"namespace": NS, "name": name, "deleted": True})
        if route == "wait":
            return httpx.Response(200, json=sandbox)
        if route == "heartbeat":
            return httpx.Response(200, json={"heartbeatTimeoutSeconds": 0, "written": False})
        if route == "network":
            self.networks.append(body)
            names_hosts = any("host" in entry for entry in body.get("allow", ()))
            answer = self.network_answer or {"generation": len(self.networks) + 1,
                                             "hostRulesInForce": True if names_hosts else None, "message": None}
            return httpx.Response(200, json=answer)
        if route in ("exec", "exec/stream"):
            # Directory set-up at start (the workdir, the mount targets) is the file system's own business:
            # a test's exec handler and ``execs`` see the commands after it (``setup_execs`` has these).
            setup = body["argv"][-1].startswith("mkdir -p ")
            (self.setup_execs if setup else self.execs).append(body)
            answer = (self.shell if setup or self.exec is None else self.exec)(body)
            if isinstance(answer, httpx.Response):
                return answer
            if route == "exec":
                return httpx.Response(200, json=answer)
            return self.stream(answer)
        if route.startswith("files"):
            return self.files(request, route, params)
        return error(404, "NotFound", f"no route {path}")

    def create(self, body: Any) -> httpx.Response:
        if not isinstance(body, dict):
            return error(400, "BadRequest", "the body must be a JSON object")
        self.created.append(body)
        if self.create_error is not None:
            return self.create_error
        name = f"{body.get('generateName', 'sbx-')}x{len(self.created):04d}"
        spec = {k: v for k, v in body.items() if k not in ("generateName", "labels", "annotations")}
        sandbox = {"metadata": {"name": name, "namespace": NS, "labels": body.get("labels", {}),
                                "annotations": body.get("annotations", {})},
                   "spec": spec, "status": self.outcome}
        self.sandboxes[name] = sandbox
        return httpx.Response(201, json=sandbox)

    @staticmethod
    def stream(answer: dict[str, Any]) -> httpx.Response:
        lines = [{"type": "started", "pid": 42}]
        for stream in ("stdout", "stderr"):
            text = answer.get(stream, "")
            lines += [{"type": stream, "data": text[i:i + 4]} for i in range(0, len(text), 4)]
        lines.append({"type": "exit", **{k: v for k, v in answer.items() if k not in ("stdout", "stderr")}})
        content = "".join(json.dumps(line) + "\n" for line in lines)
        return httpx.Response(200, content=content.encode(), headers={"content-type": "application/x-ndjson"})

    def files(self, request: httpx.Request, route: str, params: dict[str, str]) -> httpx.Response:
        target = posixpath.normpath(posixpath.join(self.cwd, params.get("path", ".")))
        node = self.fs.get(target)
        if route == "files" and request.method == "PUT":
            mode = int(params["mode"], 8) if "mode" in params else 0o644
            self.write(target, request.content, mode)
            return httpx.Response(200, json={"path": target, "size": len(request.content)})
        if route == "files" and request.method == "GET":
            if node is None or node.type != "file":
                return error(404, "NotFound", f"no file {target}")
            return httpx.Response(200, content=node.data)
        if route == "files/stat":
            if node is None:
                return httpx.Response(200, json={"path": target, "exists": False})
            return httpx.Response(200, json={"path": target, "exists": True, "type": node.type,
                                             "size": len(node.data), "mode": node.mode})
        if route == "files/tar" and request.method == "PUT":
            self.put(target, self.fs.get(target) or Node("directory", mode=0o755))
            with tarfile.open(fileobj=io.BytesIO(request.content)) as archive:
                for member in archive.getmembers():
                    where = posixpath.join(target, member.name)
                    if member.isdir():
                        self.put(where, Node("directory", mode=member.mode))
                    elif member.issym():
                        self.put(where, Node("symlink", target=member.linkname))
                    else:
                        data = archive.extractfile(member).read()  # type: ignore[union-attr]
                        self.put(where, Node("file", data, member.mode))
            return httpx.Response(200, json={"path": target, "files": len(self.under(target))})
        if route == "files/tar" and request.method == "GET":
            if node is None or node.type != "directory":
                return error(404, "NotFound", f"no directory {target}")
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                for name, entry in self.under(target):
                    info = tarfile.TarInfo(name)
                    info.mode = entry.mode
                    if entry.type == "directory":
                        info.type = tarfile.DIRTYPE
                        archive.addfile(info)
                    elif entry.type == "symlink":
                        info.type, info.linkname = tarfile.SYMTYPE, entry.target
                        archive.addfile(info)
                    else:
                        info.size = len(entry.data)
                        archive.addfile(info, io.BytesIO(entry.data))
            return httpx.Response(200, content=buffer.getvalue(), headers={"content-type": "application/x-tar"})
        return error(404, "NotFound", f"no route {route}")


@pytest.fixture
def gateway() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
async def client(gateway: FakeGateway):  # type: ignore[no-untyped-def]
    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(gateway),
                                  retry=FAST) as c:
        yield c


@pytest.fixture(autouse=True)
def _forget_handles() -> Any:
    """Handles left open on the fake gateway are forgotten, so the exit cleanup does not try to delete
    their sandboxes."""
    yield
    for handle in list(_cleanup.OPEN):
        _cleanup.forget(handle)
