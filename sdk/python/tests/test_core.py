"""The sans-I/O core (``orchard_env._core``) driven step by step: no HTTP, no sleeping, no cluster."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard_env import (
    AgentUnavailable,
    AsyncSandbox,
    AsyncSandboxClient,
    CommandFailed,
    GatewayUnreachable,
    NotFound,
    OrchardError,
    RetryPolicy,
    Sandbox,
    SandboxClient,
    SandboxFailed,
    Timeout,
    Unauthorized,
)
from orchard_env import _core
from orchard_env import client as client_module
from orchard_env._config import TokenSource

POLICY = RetryPolicy(attempts=3, backoff=1.0, max_backoff=1.5)
READY = {
    "metadata": {"name": "s1"},
    "spec": {"image": "x"},
    "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}], "agentEndpoint": "http://10.0.0.1:9090"},
}
EXEC_OK = {"exitCode": 0, "stdout": "ok\n", "stderr": "", "timedOut": False, "durationMs": 3}


class Clock:
    """A fake monotonic clock that moves ``tick`` seconds at every reading."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now = 100.0
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def drive(
    plan: _core.Plan[Any],
    answer: Callable[[_core.Send], httpx.Response],
    steps: list[Any] | None = None,
    clock: Callable[[], float] = Clock(),
    idle: bool = False,
) -> Any:
    """Performs a plan's steps in memory: ``answer`` plays the server (it may raise transport errors),
    sleeps return at once (``idle`` answers the heartbeat pauses), ``clock`` is the time."""
    steps = [] if steps is None else steps
    runner = _core.Runner(plan)
    for step in runner:
        steps.append(step)
        with runner:
            if isinstance(step, _core.Send):
                runner.value = answer(step)
            elif isinstance(step, _core.Sleep):
                runner.value = idle and step.idle
            elif isinstance(step, _core.Now):
                runner.value = clock()
            else:
                runner.value = step.fn()
    return runner.result


def answers(*responses: httpx.Response | Exception) -> Callable[[_core.Send], httpx.Response]:
    """Answers the requests in order with ``responses`` (an exception is raised instead)."""
    queue = list(responses)

    def answer(step: _core.Send) -> httpx.Response:
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return answer


def failure(status: int, code: str, retryable: bool | None = None, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"code": code, "message": code, **extra}
    if retryable is not None:
        body["retryable"] = retryable
    return httpx.Response(status, json=body)


def sends(steps: list[Any]) -> list[_core.Request]:
    return [s.request for s in steps if isinstance(s, _core.Send)]


def sleeps(steps: list[Any]) -> list[float]:
    return [s.seconds for s in steps if isinstance(s, _core.Sleep)]


# -- requests and retries --------------------------------------------------------------------------


def test_request_args_read_the_token_and_reopen_content_per_attempt(tmp_path: Path) -> None:
    opened: list[int] = []

    def content() -> list[bytes]:
        opened.append(1)
        return [b"a", b"b"]

    token = tmp_path / "token"
    token.write_text("from-file\n")
    request = _core.Request("PUT", "http://x/f", TokenSource(path=token), params={"p": "1"}, content=content,
                            headers={"Content-Type": "application/octet-stream"}, timeout=5.0)
    args = request.build_args()
    assert args["headers"] == {"Content-Type": "application/octet-stream", "Authorization": "Bearer from-file"}
    assert args["content"] == [b"a", b"b"] and args["params"] == {"p": "1"}
    assert args["timeout"] == httpx.Timeout(5.0, connect=10.0)
    request.build_args()
    assert len(opened) == 2, "each attempt re-opens the upload"
    plain = _core.Request("POST", "http://x", None, json_body={"a": 1}).build_args()
    assert plain["json"] == {"a": 1} and "Authorization" not in plain["headers"]
    assert "timeout" not in plain and "content" not in plain


def test_exchange_retries_retryable_answers_with_backoff_then_raises() -> None:
    steps: list[Any] = []
    request = _core.Request("POST", "http://gw/exec", "t")
    with pytest.raises(AgentUnavailable) as raised:
        drive(_core.exchange(request, POLICY), answers(*[failure(503, "Busy", True)] * 3), steps)
    assert raised.value.retryable and len(sends(steps)) == 3
    assert len(sleeps(steps)) == 2 and all(0 <= d <= 1.5 for d in sleeps(steps))
    steps.clear()
    ok = httpx.Response(200, json=EXEC_OK)
    assert drive(_core.exchange(request, POLICY), answers(failure(502, "AgentUnreachable", True), ok), steps) is ok
    assert len(sends(steps)) == 2


def test_exchange_never_resends_what_may_have_run() -> None:
    post = _core.Request("POST", "http://gw/exec", "t")
    steps: list[Any] = []
    with pytest.raises(Timeout):
        drive(_core.exchange(post, POLICY), answers(failure(504, "AgentTimeout", False)), steps)
    with pytest.raises(AgentUnavailable):  # no retryable flag: only idempotent methods retry
        drive(_core.exchange(post, POLICY), answers(failure(502, "BadGateway")), steps)
    read_timeout = httpx.ReadTimeout("slow", request=httpx.Request("POST", "http://gw"))
    with pytest.raises(Timeout) as timed_out:
        drive(_core.exchange(post, POLICY), answers(read_timeout), steps)
    assert timed_out.value.__cause__ is read_timeout
    assert len(sends(steps)) == 3 and not sleeps(steps)
    with pytest.raises(NotFound):
        drive(_core.exchange(_core.Request("GET", "http://gw/x"), POLICY), answers(failure(404, "NotFound")), steps)
    once = _core.Request("GET", "http://gw/wait", retry=False)
    with pytest.raises(AgentUnavailable):
        drive(_core.exchange(once, POLICY), answers(failure(503, "Busy", True)), steps)
    assert len(sends(steps)) == 5


def test_exchange_retries_connection_errors() -> None:
    refused = httpx.ConnectError("refused", request=httpx.Request("POST", "http://gw"))
    steps: list[Any] = []
    with pytest.raises(GatewayUnreachable) as down:
        drive(_core.exchange(_core.Request("POST", "http://gw/x"), POLICY), answers(refused, refused, refused), steps)
    assert down.value.retryable and len(sends(steps)) == 3
    get = _core.Request("GET", "http://gw/x")
    slow = httpx.ReadTimeout("slow", request=httpx.Request("GET", "http://gw"))
    ok = httpx.Response(200, json={})
    assert drive(_core.exchange(get, POLICY), answers(slow, ok)) is ok


def test_until_long_polls_until_an_answer_or_the_deadline() -> None:
    waits: list[float] = []

    def never(wait: float) -> _core.Plan[None]:
        waits.append(wait)
        return None
        yield  # a plan

    with pytest.raises(Timeout, match="gave up"):
        drive(_core.until(10.0, never, lambda: "gave up"), answers(), clock=Clock(tick=3.0))
    assert waits == [pytest.approx(7.0), pytest.approx(4.0), pytest.approx(1.0)]

    def third(wait: float) -> _core.Plan[str | None]:
        waits.append(wait)
        return "done" if len(waits) == 3 else None
        yield

    waits.clear()
    assert drive(_core.until(None, third, lambda: "?"), answers(), clock=Clock(tick=1000.0)) == "done"
    assert waits == [300.0, 300.0, 300.0]


def test_runner_sends_answers_and_throws_errors_into_the_plan() -> None:
    def plan() -> _core.Plan[list[Any]]:
        seen = [(yield _core.NOW)]
        try:
            yield _core.Sleep(1.0)
        except KeyError as error:
            seen.append(repr(error))
        return seen

    runner = _core.Runner(plan())
    answers_ = iter([42, KeyError("k")])
    for _step in runner:
        with runner:
            item = next(answers_)
            if isinstance(item, Exception):
                raise item
            runner.value = item
    assert runner.result == [42, "KeyError('k')"]


def test_upload_content_and_stream_events(tmp_path: Path) -> None:
    def from_path(path: Any) -> str:
        return f"path:{path}"

    def from_stream(stream: Any, start: Any) -> str:
        return f"stream@{start}"

    assert _core.upload_content(b"x", from_path, from_stream) == (b"x", True)
    assert _core.upload_content(bytearray(b"x"), from_path, from_stream) == (b"x", True)  # type: ignore[arg-type]
    assert _core.upload_content("é", from_path, from_stream) == ("é".encode(), True)
    assert _core.upload_content(str(tmp_path), from_path, from_stream) == (str(tmp_path).encode(), True), "a str is text"
    with pytest.raises(TypeError, match=r"PosixPath\(.*\) is a local path: use upload_file\(path, local_path\)"):
        _core.upload_content(tmp_path, from_path, from_stream)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes bytes or str, not int"):
        _core.upload_content(7, from_path, from_stream)  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning, match=r"use upload_file\(path, file_object\)"):
        content, again = _core.upload_content(io.BytesIO(b"x"), from_path, from_stream)  # type: ignore[arg-type]
    assert content() == "stream@0" and again

    for local in (tmp_path, str(tmp_path)):
        content, again = _core.upload_file_content(local, from_path, from_stream)
        assert content() == f"path:{tmp_path}" and again
    seekable = io.BytesIO(b"0123")
    seekable.seek(2)
    content, again = _core.upload_file_content(seekable, from_path, from_stream)
    assert content() == "stream@2" and again

    class Pipe(io.RawIOBase):
        def seekable(self) -> bool:
            return False

    content, again = _core.upload_file_content(Pipe(), from_path, from_stream)  # type: ignore[arg-type]
    assert content() == "stream@None" and not again
    with pytest.raises(TypeError, match=r"not bytes; to write content use upload\(path, data\)"):
        _core.upload_file_content(b"data", from_path, from_stream)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="binary file object"):
        _core.upload_file_content(io.StringIO("text"), from_path, from_stream)  # type: ignore[arg-type]
    assert _core.download_target("out.bin") == ("out.bin", None)
    sink = io.BytesIO()
    assert _core.download_target(sink) == (None, sink)
    with pytest.raises(TypeError, match="binary file object"):
        _core.download_target(io.StringIO())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not int"):
        _core.download_target(3)  # type: ignore[arg-type]
    assert _core.exec_event("  ") is None
    event = _core.exec_event(json.dumps({"type": "exit", "exitCode": 0}))
    assert event is not None and event.type == "exit" and event.exit_code == 0


def test_an_error_event_ends_a_stream_with_the_matching_exception() -> None:
    revoked = {"type": "error", "status": 403, "code": "AccessRevoked", "message": "access was revoked", "retryable": False}
    with pytest.raises(OrchardError) as raised:
        _core.exec_event(json.dumps(revoked))
    assert raised.value.status == 403 and raised.value.code == "AccessRevoked"
    assert type(raised.value).__name__ == "Forbidden" and not raised.value.retryable


# -- operation plans -------------------------------------------------------------------------------


@pytest.fixture
def client() -> Iterator[SandboxClient]:
    with SandboxClient("http://gw/", "tok", namespace="ns", retry=POLICY) as c:
        yield c
    for sbx in list(client_module._OPEN):  # nothing to delete at exit: there is no gateway
        if sbx.client is c:
            client_module._OPEN.discard(sbx)


def handle(client: SandboxClient, raw: dict[str, Any] | None = None, **options: Any) -> Sandbox:
    return Sandbox(client, "s1", "ns", raw or READY, delete_on_exit=False, auto_heartbeat=False, **options)


def test_exec_plan_through_the_gateway(client: SandboxClient) -> None:
    steps: list[Any] = []
    result = drive(
        handle(client)._exec_plan(["true"], check=False, timeout=5, cwd="/w", env=None, stdin=None, shell=None,
                                  max_output_bytes=None),
        answers(httpx.Response(200, json=EXEC_OK)), steps,
    )
    assert result.ok
    [request] = sends(steps)
    assert (request.method, request.url) == ("POST", "http://gw/v1/namespaces/ns/sandboxes/s1/exec")
    assert request.json_body == {"argv": ["true"], "timeoutSeconds": 5, "cwd": "/w"}
    assert request.headers == {"X-Orchard-Timeout": "35"} and request.timeout == 45.0
    failed = {**EXEC_OK, "exitCode": None, "timedOut": True, "stderr": "late"}
    with pytest.raises(CommandFailed, match=r"exited with None \(timed out\): late"):
        drive(handle(client)._exec_plan("sleep 9", check=True), answers(httpx.Response(200, json=failed)))


def test_direct_mode_asks_the_gateway_for_the_target_with_its_retries_and_keeps_it() -> None:
    direct = SandboxClient("http://gw", "tok", namespace="ns", direct=True, retry=POLICY)
    # status.agentEndpoint says 10.0.0.1 (forgeable): never used; the gateway's answer is.
    sbx = Sandbox(direct, "s1", "ns", READY, delete_on_exit=False, auto_heartbeat=False, direct=True)
    target = {"endpoint": "http://10.0.0.7:9090/", "token": "ab" * 32}
    steps: list[Any] = []
    drive(sbx._list_files_plan("."), answers(
        failure(503, "Unavailable", True), httpx.Response(200, json=target), httpx.Response(200, json={"entries": []}),
    ), steps)
    first, again, agent = sends(steps)
    assert first == again, "the token route is retried like every gateway call"
    assert (first.method, first.url) == ("GET", "http://gw/v1/namespaces/ns/sandboxes/s1/token")
    assert first.token is direct.settings.token and first.retry
    assert len(sleeps(steps)) == 1
    assert (agent.url, agent.token, agent.params) == ("http://10.0.0.7:9090/v1/files/list", "ab" * 32, {"path": "."})
    steps.clear()
    drive(sbx._kill_process_plan("p1"), answers(httpx.Response(200, json={"id": "p1", "state": "exited"})), steps)
    assert [r.url for r in sends(steps)] == ["http://10.0.0.7:9090/v1/processes/p1"], "asked once per handle"
    # An answer without an http(s) endpoint and a token is refused, and nothing goes to the agent.
    bad_answers: list[Any] = [{"endpoint": "10.0.0.7:9090", "token": "t"}, {"endpoint": "http://10.0.0.7:9090", "token": ""}, []]
    for bad in bad_answers:
        fresh = Sandbox(direct, "s1", "ns", READY, delete_on_exit=False, auto_heartbeat=False, direct=True)
        steps.clear()
        with pytest.raises(OrchardError, match="no agent endpoint and token for sandbox ns/s1"):
            drive(fresh._list_files_plan("."), answers(httpx.Response(200, json=bad)), steps)
        assert len(sends(steps)) == 1 and fresh._direct_target is None


def test_direct_mode_asks_again_for_the_target_when_the_pod_is_gone_and_sends_once_more_only_if_it_changed() -> None:
    direct = SandboxClient("http://gw", "tok", namespace="ns", direct=True, retry=POLICY)
    sbx = Sandbox(direct, "s1", "ns", READY, delete_on_exit=False, auto_heartbeat=False, direct=True)
    old = {"endpoint": "http://10.0.0.7:9090/", "token": "ab" * 32}
    new = {"endpoint": "http://10.0.0.9:9090/", "token": "cd" * 32}
    steps: list[Any] = []
    # spec.retry gave the sandbox a new pod: the old one's token is refused; the new target is used.
    drive(sbx._list_files_plan("."), answers(
        httpx.Response(200, json=old), failure(401, "Unauthorized", False),
        httpx.Response(200, json=new), httpx.Response(200, json={"entries": []}),
    ), steps)
    urls = [r.url for r in sends(steps)]
    assert urls == [
        "http://gw/v1/namespaces/ns/sandboxes/s1/token", "http://10.0.0.7:9090/v1/files/list",
        "http://gw/v1/namespaces/ns/sandboxes/s1/token", "http://10.0.0.9:9090/v1/files/list",
    ]
    assert sends(steps)[-1].token == "cd" * 32
    # The same target again: the refusal stands, nothing is sent twice.
    steps.clear()
    with pytest.raises(Unauthorized):
        drive(sbx._list_files_plan("."), answers(failure(401, "Unauthorized", False), httpx.Response(200, json=new)), steps)
    assert [r.url for r in sends(steps)] == [
        "http://10.0.0.9:9090/v1/files/list", "http://gw/v1/namespaces/ns/sandboxes/s1/token",
    ]


def test_wait_ready_tracks_the_phase_and_starts_heartbeats(client: SandboxClient) -> None:
    started: list[bool] = []
    sbx = handle(client, {"metadata": {"name": "s1"}})
    sbx._start_heartbeats = lambda: started.append(True)  # type: ignore[method-assign]
    waiting = failure(504, "WaitTimeout", True, phase="Pending")
    steps: list[Any] = []
    assert drive(sbx._wait_ready_plan(None), answers(waiting, httpx.Response(200, json=READY)), steps) is sbx
    assert started == [True] and sbx.phase == "Ready"
    assert [r.params for r in sends(steps)] == [{"timeoutSeconds": "300.000"}] * 2
    assert all(r.retry is False and r.timeout == 330.0 for r in sends(steps))
    with pytest.raises(Timeout, match=r"not Ready after 1.0s \(phase Pending\)$"):
        drive(sbx._wait_ready_plan(1.0), answers(waiting, waiting), clock=Clock(tick=0.4))
    # The async handle tracks the phase a server-side wait reports, like the sync one.
    async_sbx = AsyncSandbox(AsyncSandboxClient("http://gw", "t", namespace="ns"), "s1", "ns", {}, auto_heartbeat=False)
    with pytest.raises(Timeout, match=r"\(phase Pending\)"):
        drive(async_sbx._wait_ready_plan(1.0), answers(waiting, waiting), clock=Clock(tick=0.4))
    failed = {"metadata": {"name": "s1"}, "status": {"phase": "Failed", "reason": "ImagePullBackOff"}}
    with pytest.raises(SandboxFailed) as broken:
        drive(sbx._wait_ready_plan(None), answers(httpx.Response(200, json=failed)))
    assert broken.value.reason == "ImagePullBackOff"


def test_create_plan_deletes_a_sandbox_that_never_became_ready(client: SandboxClient) -> None:
    plan = client._create_plan(None, wait=True, wait_timeout=None, delete_on_exit=True, auto_heartbeat=False,
                               direct=None, image="x", generate_name="t-")
    with pytest.raises(ValueError):
        client._create_plan(None, wait=True, wait_timeout=None, delete_on_exit=True, auto_heartbeat=False, direct=None, image=None)
    steps: list[Any] = []
    failed = {"metadata": {"name": "t-1"}, "status": {"phase": "Failed"}}
    with pytest.raises(SandboxFailed):
        drive(plan(), answers(
            httpx.Response(201, json={"metadata": {"name": "t-1"}}), httpx.Response(200, json=failed),
            failure(404, "NotFound"),
        ), steps)
    create, wait, delete = sends(steps)
    assert (create.method, create.json_body, create.retry) == (
        "POST", {"generateName": "t-", "image": "x", "heartbeatTimeoutSeconds": 600}, False)
    assert (delete.method, delete.url) == ("DELETE", "http://gw/v1/namespaces/ns/sandboxes/t-1")
    assert any(isinstance(s, _core.Call) for s in steps), "heartbeats are stopped before the delete"


def test_heartbeat_loop(client: SandboxClient, caplog: pytest.LogCaptureFixture) -> None:
    sbx = handle(client)
    beat = httpx.Response(200, json={"heartbeatTimeoutSeconds": 3})
    steps: list[Any] = []
    # No timeout in the spec: the first beat tells it; then beats every third of it until stopped.
    drive(sbx._heartbeat_loop(None), answers(beat), steps, idle=True)
    assert len(sends(steps)) == 1 and sleeps(steps) == [1.0]
    steps.clear()
    drive(sbx._heartbeat_loop(3), answers(failure(500, "Oops"), beat, failure(404, "NotFound")), steps)
    assert len(sends(steps)) == 3 and sleeps(steps) == [1.0, 1.0, 1.0]
    assert "heartbeat failed (will retry)" in caplog.text
    steps.clear()
    drive(sbx._heartbeat_loop(0), answers(), steps)
    assert steps == [], "heartbeats off"


@pytest.mark.parametrize(
    ("fields", "body"),
    [
        ({"image": "x"}, {"image": "x", "heartbeatTimeoutSeconds": 600}),
        ({"image": "x", "heartbeat_timeout_seconds": 0}, {"image": "x", "heartbeatTimeoutSeconds": 0}),
        ({"image": "x", "heartbeat_timeout_seconds": 60}, {"image": "x", "heartbeatTimeoutSeconds": 60}),
        ({"image": "x", "extra": {"lifecycle": {"ttlSeconds": 60}}},
         {"image": "x", "lifecycle": {"ttlSeconds": 60, "heartbeatTimeoutSeconds": 600}}),
        ({"image": "x", "extra": {"lifecycle": {"heartbeatTimeoutSeconds": 5}}},
         {"image": "x", "lifecycle": {"heartbeatTimeoutSeconds": 5}}),
        ({"image": None, "spec": {"image": "x"}},
         {"spec": {"image": "x", "lifecycle": {"heartbeatTimeoutSeconds": 600}}}),
        ({"image": None, "spec": {"image": "x", "lifecycle": {"ttlSeconds": 9}}},
         {"spec": {"image": "x", "lifecycle": {"ttlSeconds": 9, "heartbeatTimeoutSeconds": 600}}}),
        ({"image": None, "spec": {"image": "x", "lifecycle": {"heartbeatTimeoutSeconds": 0}}},
         {"spec": {"image": "x", "lifecycle": {"heartbeatTimeoutSeconds": 0}}}),
        # A pool claim keeps the template's lifecycle (a lifecycle of its own would replace all of it).
        ({"image": None, "extra": {"pool": "py"}}, {"pool": "py"}),
        ({"image": None, "spec": {"pool": "py"}}, {"spec": {"pool": "py"}}),
        ({"image": None, "extra": {"pool": "py"}, "heartbeat_timeout_seconds": 30}, {"pool": "py", "heartbeatTimeoutSeconds": 30}),
    ],
)
def test_created_sandboxes_get_a_600s_heartbeat_timeout_unless_the_caller_sets_one(
    client: SandboxClient, fields: dict[str, Any], body: dict[str, Any]
) -> None:
    original = copy.deepcopy(fields)
    plan = client._create_plan(None, wait=False, wait_timeout=None, delete_on_exit=False, auto_heartbeat=False,
                               direct=None, **fields)
    steps: list[Any] = []
    drive(plan(), answers(httpx.Response(201, json={"metadata": {"name": "s1"}})), steps)
    [create] = sends(steps)
    assert create.json_body == body
    assert fields == original, "the caller's spec and lifecycle are not changed"
