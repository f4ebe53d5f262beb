"""A fake gateway with a fake controller behind it, for tests with no cluster: Sandboxes (create, wait,
heartbeat, exec of ``cat``, file uploads, result, delete) and trainer-driven RolloutGroups whose trajectory
Sandboxes are launched stride by stride and whose group is chosen by a simplified BAR (the real engine is
the operator's, docs/BAR.md): after each stride, a balanced group of ``groupSize`` members with a number
of positives within ``positiveFraction`` when the results allow one (shortest first), else the next stride,
else ``Relaxed`` (any mix of positives and negatives) or ``Dropped`` (``ZeroVariance``).

``FakeController.handle`` is the sync transport's handler, ``ahandle`` the async one's (its waits sleep,
so the event loop runs the episodes meanwhile). Every request is recorded in ``sent`` (method, URL, headers
and body) to check what left the trainer."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from typing import Any

import httpx

NS = "ns"
BASE = f"/v1/namespaces/{NS}"
GROUP_LABEL = "orchard.dev/rollout-group"
#: Longest a fake server-side wait lasts before answering 504 (a real gateway's lasts the asked seconds).
WAIT_SLICE = 0.02


def _ready(meta: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": meta, "spec": {"image": "x"},
            "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True", "reason": "SandboxReady"}]}}


def _answer(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, json=body)


def _not_found(what: str) -> httpx.Response:
    return _answer(404, {"code": "NotFound", "message": f"{what} not found"})


class FakeController:
    """The gateway and the controller, in memory. ``create_delay``: seconds a sandbox create answers late
    (the sandbox exists at once: a create under way when the caller gives up), by the create's
    ``generateName``."""

    def __init__(self, *, create_delay: dict[str, float] | None = None) -> None:
        self.lock = threading.Lock()
        self.create_delay = create_delay or {}
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.files: dict[tuple[str, str], bytes] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.groups_created: list[str] = []
        self.groups_deleted: list[str] = []
        self.sent: list[str] = []
        self._names = itertools.count()

    # -- transports --------------------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        answer, delay = self._route(request)
        if delay:
            time.sleep(delay)
        return answer if answer is not None else self._wait(request, time.sleep)

    async def ahandle(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        answer, delay = self._route(request)
        if delay:
            await asyncio.sleep(delay)
        if answer is not None:
            return answer
        deadline = time.monotonic() + WAIT_SLICE
        while (done := self._wait_once(request)) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        return done or self._wait_timeout()

    def _wait(self, request: httpx.Request, sleep: Any) -> httpx.Response:
        deadline = time.monotonic() + WAIT_SLICE
        while (done := self._wait_once(request)) is None and time.monotonic() < deadline:
            sleep(0.002)
        return done or self._wait_timeout()

    @staticmethod
    def _wait_timeout() -> httpx.Response:
        return _answer(504, {"code": "WaitTimeout", "message": "not yet; wait again", "retryable": True})

    # -- routes ------------------------------------------------------------------------------------------

    def _route(self, request: httpx.Request) -> tuple[httpx.Response | None, float]:
        """The answer (None: a wait, answered by ``_wait_once``) and how late to give it."""
        path, method = request.url.path, request.method
        with self.lock:
            self.sent.append(f"{method} {request.url} {dict(request.headers)} {request.content!r}")
            if path == f"{BASE}/sandboxes" and method == "POST":
                body = json.loads(request.content)
                delay = self.create_delay.get(body.get("generateName") or (body.get("metadata") or {}).get("generateName"), 0.0)
                return self._create_sandbox(body), delay
            if path == f"{BASE}/sandboxes" and method == "GET":
                return self._list(request.url.params.get("labelSelector", "")), 0.0
            if path == f"{BASE}/rolloutgroups" and method == "POST":
                return self._create_group(json.loads(request.content)), 0.0
            if path.startswith(f"{BASE}/rolloutgroups/"):
                name, _, rest = path.removeprefix(f"{BASE}/rolloutgroups/").partition("/")
                if name not in self.groups:
                    return _not_found(f"rolloutgroup {name}"), 0.0
                if rest == "wait":
                    return None, 0.0
                if method == "DELETE":
                    return self._delete_group(name), 0.0
                return _answer(200, self.groups[name]["object"]), 0.0
            name, _, rest = path.removeprefix(f"{BASE}/sandboxes/").partition("/")
            if name not in self.sandboxes:
                return _not_found(f"sandbox {name}"), 0.0
            if rest == "wait":
                return None, 0.0
            if method == "DELETE":
                self._delete_sandbox(name)
                return _answer(200, {"deleted": True}), 0.0
            if rest == "heartbeat":
                return _answer(200, {"heartbeatTimeoutSeconds": 600}), 0.0
            if rest == "files" and method == "PUT":
                self.files[(name, request.url.params["path"])] = request.content
                return _answer(200, {"path": request.url.params["path"], "size": len(request.content)}), 0.0
            if rest == "exec":
                return self._exec(name, json.loads(request.content)), 0.0
            if rest == "result":
                return self._result(name, json.loads(request.content)), 0.0
            return _answer(200, self.sandboxes[name]), 0.0

    def _wait_once(self, request: httpx.Request) -> httpx.Response | None:
        path = request.url.path
        with self.lock:
            if path.startswith(f"{BASE}/rolloutgroups/"):
                name = path.removeprefix(f"{BASE}/rolloutgroups/").split("/")[0]
                group = self.groups.get(name)
                if group is None:
                    return _not_found(f"rolloutgroup {name}")
                return _answer(200, group["object"]) if group["object"]["status"].get("phase") == "Complete" else None
            name = path.removeprefix(f"{BASE}/sandboxes/").split("/")[0]
            if name not in self.sandboxes:
                return _not_found(f"sandbox {name}")
            return _answer(200, self.sandboxes[name])

    # -- sandboxes ---------------------------------------------------------------------------------------

    def _create_sandbox(self, body: dict[str, Any]) -> httpx.Response:
        meta = body.get("metadata") or {}
        name = body.get("name") or meta.get("name") or f"{body.get('generateName') or meta.get('generateName') or 'sbx-'}{next(self._names)}"
        raw = _ready({"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": dict(body.get("labels") or meta.get("labels") or {})})
        self.sandboxes[name] = raw
        self.created.append(name)
        return _answer(201, raw)

    def _delete_sandbox(self, name: str) -> None:
        raw = self.sandboxes.pop(name)
        self.deleted.append(name)
        group = (raw["metadata"].get("labels") or {}).get(GROUP_LABEL)
        if group in self.groups and name not in self.groups[group]["results"]:
            self.groups[group]["results"][name] = {"status": "aborted", "reason": "SandboxDeleted"}

    def _list(self, selector: str) -> httpx.Response:
        group = selector.removeprefix(f"{GROUP_LABEL}=")
        if group in self.groups:
            self._tick(group)
        items = [raw for raw in self.sandboxes.values() if (raw["metadata"].get("labels") or {}).get(GROUP_LABEL) == group]
        return _answer(200, {"items": items})

    def _exec(self, name: str, body: dict[str, Any]) -> httpx.Response:
        argv = body.get("argv") or []
        if len(argv) == 2 and argv[0] == "cat":
            path = argv[1] if argv[1].startswith("/") or not body.get("cwd") else f"{body['cwd']}/{argv[1]}"
            content = self.files.get((name, path))
            if content is None:
                return _answer(200, {"exitCode": 1, "stdout": "", "stderr": f"cat: {path}: No such file", "timedOut": False})
            return _answer(200, {"exitCode": 0, "stdout": content.decode(), "stderr": "", "timedOut": False})
        return _answer(200, {"exitCode": 0, "stdout": "", "stderr": "", "timedOut": False})

    def _result(self, name: str, body: dict[str, Any]) -> httpx.Response:
        raw = self.sandboxes[name]
        group = (raw["metadata"].get("labels") or {}).get(GROUP_LABEL)
        if group not in self.groups:
            return _answer(409, {"code": "NotTrajectory", "message": name})
        results = self.groups[group]["results"]
        if name in results and results[name] != body:
            return _answer(409, {"code": "ResultAlreadyRecorded", "message": name})
        results[name] = body
        raw["status"]["result"] = body
        return _answer(200, {"recorded": True, "result": body})

    # -- rollout groups ----------------------------------------------------------------------------------

    def _create_group(self, body: dict[str, Any]) -> httpx.Response:
        name = body.get("name") or f"{body.get('generateName') or 'group-'}{next(self._names)}"
        spec = {key: body[key] for key in ("template", "groupSize", "maxTrajectories", "stride", "positiveFraction") if key in body}
        spec.setdefault("groupSize", 4)
        spec.setdefault("maxTrajectories", spec["groupSize"])
        spec.setdefault("stride", spec["maxTrajectories"])
        obj = {"metadata": {"name": name, "namespace": NS}, "spec": spec, "status": {"phase": "Pending"}}
        self.groups[name] = {"object": obj, "results": {}, "launched": 0}
        self.groups_created.append(name)
        return _answer(201, obj)

    def _delete_group(self, name: str) -> httpx.Response:
        del self.groups[name]
        self.groups_deleted.append(name)
        for sandbox in [n for n, raw in self.sandboxes.items() if (raw["metadata"].get("labels") or {}).get(GROUP_LABEL) == name]:
            self._delete_sandbox(sandbox)
        return _answer(200, {"deleted": True})

    def _tick(self, name: str) -> None:
        """A reconcile: launch the first stride, or, once every launched trajectory has a result, record a
        group or launch the next stride."""
        group = self.groups[name]
        spec, obj = group["object"]["spec"], group["object"]
        if obj["status"].get("phase") == "Complete":
            return
        if group["launched"] == 0:
            self._launch(name)
            return
        if len(group["results"]) < group["launched"]:
            return
        chosen = self._select(group, final=group["launched"] >= spec["maxTrajectories"])
        if chosen is None:
            self._launch(name)
            return
        selection, members = chosen
        results = group["results"]
        obj["status"] = {
            "phase": "Complete",
            "selection": selection,
            "positives": sum(1 for m in members if (results[m].get("reward") or 0) > 0),
            "conditions": [{"type": "Complete", "status": "True"}],
            "group": [{"name": m, **results[m]} for m in members],
            "trajectories": [{"name": n, "stride": int(n.rsplit("-", 1)[1]) // spec["stride"], **r}
                             for n, r in sorted(results.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[1]))],
        }
        if selection == "Dropped":
            obj["status"]["dropReason"] = "ZeroVariance"

    def _launch(self, name: str) -> None:
        group = self.groups[name]
        spec = group["object"]["spec"]
        group["object"]["status"] = {"phase": "Generating"}
        for index in range(group["launched"], min(group["launched"] + spec["stride"], spec["maxTrajectories"])):
            trajectory = f"{name}-{index}"
            labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            self.sandboxes[trajectory] = _ready({"name": trajectory, "namespace": NS, "uid": f"uid-{trajectory}",
                                                 "labels": {**labels, GROUP_LABEL: name}})
        group["launched"] = min(group["launched"] + spec["stride"], spec["maxTrajectories"])

    @staticmethod
    def _select(group: dict[str, Any], final: bool) -> tuple[str, list[str]] | None:
        spec, results = group["object"]["spec"], group["results"]
        size = spec["groupSize"]
        fraction = spec.get("positiveFraction") or {"min": 0.0, "max": 1.0}

        def ranked(names: list[str]) -> list[str]:
            return sorted(names, key=lambda n: (results[n].get("length") or 0, int(n.rsplit("-", 1)[1])))

        usable = [n for n, r in results.items() if r.get("status") != "aborted"]
        positives = ranked([n for n in usable if (results[n].get("reward") or 0) > 0])
        negatives = ranked([n for n in usable if (results[n].get("reward") or 0) <= 0])
        low, high = math.ceil(fraction["min"] * size), math.floor(fraction["max"] * size)
        middle = (low + high) / 2
        feasible = [k for k in range(low, high + 1) if k <= len(positives) and size - k <= len(negatives)]
        if feasible:
            k = min(feasible, key=lambda k: (abs(k - middle), k))
            return "Balanced", positives[:k] + negatives[:size - k]
        if not final:
            return None
        relaxed = range(max(1, size - len(negatives)), min(len(positives), size - 1) + 1)
        if relaxed:
            return "Relaxed", positives[:relaxed[0]] + negatives[:size - relaxed[0]]
        return "Dropped", []
