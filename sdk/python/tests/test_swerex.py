"""``orchard_env.integrations.swerex`` (SWE-ReX 1.4.0's deployment and runtime protocols on a sandbox).

Without a cluster, against a fake gateway whose agent (:class:`ShellAgent`, an ``httpx.MockTransport``
handler like the SDK's other fakes) answers the agent's session, exec and file routes with real local
processes: each session is a local bash run the way the agent runs it (docs/AGENT.md, "Shell sessions":
the same prelude, SIGINT trap, end marker, expect-style reads, interrupt at a run's timeout and session
signals), each exec
a local process of its own group. So SWE-ReX's own runtime behaviours run for real: cwd and variables
carrying over, an interactive program driven with ``expect``, interrupts, ``check``, timeouts, ``execute``,
files, directory upload, session errors; error types and messages are compared with SWE-ReX's
``LocalRuntime``. The same scenarios run on the local cluster (marked ``cluster``) in a sandbox of the
Python image (``debian-python`` on the real node), created by :class:`OrchardDeployment`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shlex
import signal
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

if os.environ.get("CI") == "true":
    import swerex  # noqa: F401  (the SDK venv pins it: missing is a failure under CI)
else:
    pytest.importorskip("swerex")

import pexpect  # noqa: E402
from swerex.deployment.config import get_deployment  # noqa: E402
from swerex.deployment.hooks.abstract import DeploymentHook  # noqa: E402
from swerex.exceptions import (  # noqa: E402
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    DeploymentStartupError,
    NoExitCodeError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (  # noqa: E402
    AbstractRuntime,
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)
from swerex.runtime.local import LocalRuntime  # noqa: E402

from orchard_env import NotFound, SandboxClient  # noqa: E402
from orchard_env.integrations.swerex import (  # noqa: E402
    PS1,
    OrchardDeployment,
    OrchardDeploymentConfig,
    OrchardRuntime,
)

from conftest import FAST, Cluster  # noqa: E402

BASE = "/v1/namespaces/ns/sandboxes"
READY = {
    "metadata": {"name": "s1", "namespace": "ns", "uid": "u1"},
    "spec": {"image": "x"},
    "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True", "reason": "SandboxReady"}]},
}
STALLED = {
    "metadata": {"name": "s1", "namespace": "ns"},
    "spec": {"pool": "py"},
    "status": {"phase": "Pending", "conditions": [
        {"type": "Ready", "status": "False", "reason": "NotScheduled", "message": "waiting for a member"},
        {"type": "Stalled", "status": "True", "reason": "PoolNotFound", "message": 'SandboxPool "py" does not exist'},
    ]},
}
#: What the agent's shell runs first (agent/src/sessions/shell.rs).
PRELUDE = "__orchard_run() { command eval \"$__orchard_command\"; }\ntrap 'return 130' INT\n"
#: How long the fake agent gives an interrupted command before it goes further (the agent: 2 s).
GRACE = 1.0


def error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": message, "retryable": False})


#: The signal names the agent takes (agent/src/processes/signals.rs), with or without ``SIG``.
SIGNALS = {name: getattr(signal, f"SIG{name}") for name in
           ("HUP", "INT", "QUIT", "KILL", "USR1", "USR2", "TERM", "CONT", "STOP", "ALRM", "WINCH")}


def signal_number(spec: Any) -> int | None:
    """The number of a signal given as the agent takes it (a name or 1-64), else None."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec if 1 <= spec <= 64 else None
    if isinstance(spec, str):
        name = spec.strip().upper()
        return SIGNALS.get(name.removeprefix("SIG"))
    return None


def children_of(pid: int) -> list[int] | None:
    """The children of single-threaded process ``pid`` (None where the kernel does not list them)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return None


def processes() -> dict[int, int]:
    """Every process now, pid -> parent."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return found


class LocalShell:
    """One session of :class:`ShellAgent`: a local shell in a process group of its own, fed commands the
    way the agent feeds them (agent/src/sessions: marker.rs, output.rs, session.rs)."""

    def __init__(self, id: str, shell: str, cwd: str | None, env: dict[str, str]) -> None:
        self.id, self.shell, self.cwd, self.env = id, shell, cwd, env
        self.cond = threading.Condition()
        #: The run in progress, as the agent keeps it: the shell's children when it started (None: no run).
        self.active: list[int] | None = None
        self._spawn()

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            [self.shell], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=self.cwd, env={**os.environ, **self.env}, process_group=0,
        )
        self.segment = bytearray()
        self.cursor = 0
        self.needle: bytes | None = None
        self.finished: tuple[bytes, int] | None = None
        self.closed = False
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        self.write(PRELUDE.encode())
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def write(self, data: bytes) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError):
            return False

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        while True:
            chunk = os.read(proc.stdout.fileno(), 65536)
            with self.cond:
                if proc is not self.proc:
                    return
                if not chunk:
                    self.closed = True
                    self.cond.notify_all()
                    return
                self.segment += chunk
                self._scan()
                self.cond.notify_all()

    def _scan(self) -> None:
        if self.needle is None:
            return
        at = self.segment.find(self.needle)
        end = self.segment.find(b"\n", at) if at >= 0 else -1
        if end < 0:
            return
        status = int(self.segment[at + len(self.needle):end])
        output, after = bytes(self.segment[:at]), bytes(self.segment[end + 1:])
        # What no read returned stays readable after the run's end, until the next run starts.
        self.segment = bytearray(output[self.cursor:] + after)
        self.cursor = 0
        self.finished, self.needle = (output, status), None

    def _visible(self) -> bytes:
        """Unread output, holding back what may be the start of the end marker."""
        data = bytes(self.segment[self.cursor:])
        if self.needle is not None:
            for keep in range(min(len(data), len(self.needle)), 0, -1):
                if self.needle.startswith(data[-keep:]):
                    return data[:-keep]
        return data

    def status(self) -> dict[str, Any]:
        code = self.proc.poll()
        return {"id": self.id, "shell": self.shell, "pid": self.proc.pid,
                "state": "running" if code is None else "exited", "exitCode": code,
                "busy": self.active is not None, "startedAt": self.started_at}

    def signal(self, number: int) -> httpx.Response:
        """As the agent's ``POST /v1/sessions/{id}/signal``: SIGINT to the shell's process group, any other
        signal to the processes below the shell but the run's earlier children (and theirs); nothing
        without a run in progress."""
        if self.proc.poll() is not None:
            return error(409, "Conflict", f"the shell of session `{self.id}` has exited")
        earlier = self.active
        if earlier is not None:
            if number == signal.SIGINT:
                os.killpg(self.proc.pid, number)
            else:
                tree = processes()
                below, queue = [], [self.proc.pid]
                while queue:
                    parent = queue.pop()
                    for pid, of in tree.items():
                        if of == parent and pid not in earlier and pid not in below:
                            below.append(pid)
                            queue.append(pid)
                for pid in below:
                    with contextlib.suppress(OSError):
                        os.kill(pid, number)
        return httpx.Response(200, json={"running": earlier is not None, "session": self.status()})

    def _wait(self, deadline: float, done: Any) -> bool:
        with self.cond:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def run(self, command: str, timeout: float) -> httpx.Response:
        earlier = children_of(self.proc.pid) or []
        with self.cond:
            if self.proc.poll() is not None or self.active is not None:
                return error(409, "Conflict", f"a run is in progress in session `{self.id}`, or its shell has exited")
            self.active = earlier
        try:
            started = time.monotonic()
            token = uuid.uuid4().hex
            with self.cond:
                self.segment, self.cursor, self.finished = bytearray(), 0, None
                self.needle = f"__orchard_end_{token}__:".encode()
            line = (f"trap 'return 130' INT; __orchard_command={shlex.quote(command)}; __orchard_run; "
                    f"printf '%s%s:%s\\n' '__orchard_end_' '{token}__' \"$?\"\n")
            self.write(line.encode())
            answer = {"exitCode": None, "timedOut": False, "shellExited": False, "shellRestarted": False,
                      "outputTruncated": False, "outputLossy": False, "outputEncoding": "text"}
            ended = lambda: self.finished is not None or self.closed  # noqa: E731
            if not self._wait(started + timeout, ended):
                answer["timedOut"] = True
                os.killpg(self.proc.pid, signal.SIGINT)
                if not self._wait(time.monotonic() + GRACE, ended):
                    kill_below(self.proc.pid)
                    if not self._wait(time.monotonic() + GRACE, ended):
                        with self.cond:
                            output = bytes(self.segment)
                        os.killpg(self.proc.pid, signal.SIGKILL)
                        self.proc.wait()
                        with self.cond:
                            self._spawn()
                        answer.update(output=output.decode(errors="replace"), shellRestarted=True,
                                      durationMs=int((time.monotonic() - started) * 1000))
                        return httpx.Response(200, json=answer)
            with self.cond:
                if self.finished is not None:
                    output, status = self.finished
                    self.finished = None
                    answer["exitCode"] = status
                else:
                    output = bytes(self.segment)
                    answer["shellExited"] = True
            if answer["shellExited"]:
                answer["exitCode"] = self.proc.wait()
            answer.update(output=output.decode(errors="replace"), durationMs=int((time.monotonic() - started) * 1000))
            return httpx.Response(200, json=answer)
        finally:
            with self.cond:
                self.active = None

    def read(self, until: str | None, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                data = self._visible()
                if until is None:
                    break
                at = data.find(until.encode())
                if at >= 0:
                    data = data[: at + len(until.encode())]
                    self.cursor += len(data)
                    return {"output": data.decode(errors="replace"), "matched": True, "shellExited": False}
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    break
                self.cond.wait(left)
            self.cursor += len(data)
            return {"output": data.decode(errors="replace"), "matched": False, "shellExited": self.closed}

    def close(self) -> dict[str, Any]:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return self.status()


def kill_below(group: int) -> None:
    """SIGKILLs the processes of process group ``group`` but its leader (the agent's second step)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == group:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


class ShellAgent:
    """The gateway (sandbox ``ns/s1``: create, wait, get, delete) and the sandbox's agent, whose sessions,
    execs and files are local: paths are this machine's (tests use paths under ``tmp_path``)."""

    def __init__(self, wait: dict[str, Any] | None = None) -> None:
        self.sessions: dict[str, LocalShell] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.deleted = 0
        self.gone = False
        self.wait_answer = wait or READY
        self.lock = threading.Lock()

    def close(self) -> None:
        for shell in list(self.sessions.values()):
            shell.close()

    def sent(self, method: str, route: str) -> list[Any]:
        return [body for m, r, body in self.calls if (m, r) == (method, route)]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if (request.method, path) == ("POST", BASE):
            self.created.append(json.loads(request.content))
            self.gone = False
            return httpx.Response(201, json={"metadata": {"name": "s1", "namespace": "ns"}})
        if path.startswith(f"{BASE}/s1") and self.gone:
            return error(404, "NotFound", 'sandboxes.orchard.dev "s1" not found')
        if path == f"{BASE}/s1/wait":
            return httpx.Response(200, json=self.wait_answer)
        if path == f"{BASE}/s1":
            if request.method == "DELETE":
                self.deleted += 1
                self.gone = True
                return httpx.Response(200, json={"deleted": True})
            return httpx.Response(200, json=READY)
        route = path.removeprefix(f"{BASE}/s1")
        params = request.url.params
        body = json.loads(request.content) if request.content and request.headers.get("content-type", "").startswith("application/json") else None
        with self.lock:
            self.calls.append((request.method, route, body))
        if route == "/heartbeat":
            return httpx.Response(200, json={"heartbeatTimeoutSeconds": 0})
        if route == "/sessions":
            if request.method == "POST":
                shell = LocalShell(f"s-{uuid.uuid4().hex[:16]}", (body or {}).get("shell") or "/bin/bash",
                                   (body or {}).get("cwd"), (body or {}).get("env") or {})
                self.sessions[shell.id] = shell
                return httpx.Response(201, json=shell.status())
            return httpx.Response(200, json={"sessions": [s.status() for s in self.sessions.values()]})
        if route.startswith("/sessions/"):
            id, _, action = route.removeprefix("/sessions/").partition("/")
            shell = self.sessions.get(id)
            if shell is None:
                return error(404, "NotFound", f"no session {id}")
            if action == "run":
                return shell.run(body["command"], body.get("timeoutMs", 600_000) / 1000)
            if action == "input":
                if shell.proc.poll() is not None or not shell.write(body["text"].encode()):
                    return error(409, "Conflict", "the shell has exited")
                return httpx.Response(200, json=shell.status())
            if action == "read":
                return httpx.Response(200, json=shell.read(body.get("until"), min(body.get("timeoutMs", 10_000), 300_000) / 1000))
            if action == "signal":
                number = signal_number((body or {}).get("signal", "INT"))
                if number is None:
                    return error(400, "BadRequest", f"unknown signal `{(body or {}).get('signal')}`")
                return shell.signal(number)
            if request.method == "DELETE":
                del self.sessions[id]
                return httpx.Response(200, json=shell.close())
            return httpx.Response(200, json=shell.status())
        if route == "/exec":
            return self.exec(body)
        if route == "/files/stat":
            target = Path(params["path"])
            kind = "directory" if target.is_dir() else "file" if target.exists() else None
            return httpx.Response(200, json={"path": str(target), "exists": kind is not None, "type": kind})
        if route == "/files/tar" and request.method == "PUT":
            target = Path(params["path"])
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(request.content)) as archive:
                archive.extractall(target, filter="tar")
            return httpx.Response(201, json={"path": str(target), "files": 0})
        if route == "/files":
            return self.file(request.method, Path(params["path"]), request.content, params.get("mode"))
        return error(404, "NotFound", route)

    def exec(self, body: dict[str, Any]) -> httpx.Response:
        cwd = body.get("cwd")
        if cwd is not None and not Path(cwd).is_dir():
            why = "is not a directory" if Path(cwd).exists() else "is not usable: No such file or directory (os error 2)"
            return error(400, "InvalidCwd", f"cwd `{cwd}` {why}")
        argv = body.get("argv") or [body.get("shell") or "/bin/sh", "-c", body["command"]]
        stdin = base64.b64decode(body["stdinBase64"]) if "stdinBase64" in body else body.get("stdin", "").encode()
        answer: dict[str, Any] = {"exitCode": None, "signal": None, "timedOut": False, "stdout": "", "stderr": "",
                                  "durationMs": 1}
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=cwd, env={**os.environ, **(body.get("env") or {})}, process_group=0)
        except (FileNotFoundError, PermissionError) as failed:
            code = 127 if isinstance(failed, FileNotFoundError) else 126
            message = f"cannot run `{argv[0]}`: {failed.strerror}"
            return httpx.Response(200, json={**answer, "exitCode": code, "stderr": message + "\n", "error": message})
        try:
            out, err = proc.communicate(stdin, timeout=body.get("timeoutSeconds", 600))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            answer["timedOut"] = True
        code = proc.returncode
        answer.update(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                      exitCode=code if code >= 0 else None, signal=-code if code < 0 else None)
        return httpx.Response(200, json=answer)

    def file(self, method: str, target: Path, content: bytes, mode: str | None) -> httpx.Response:
        if method == "GET":
            if target.is_dir():
                return error(400, "InvalidPath", f"`{target}` is a directory; list it with GET /v1/files/list")
            if not target.exists():
                return error(404, "NotFound", f"cannot open `{target}`: No such file or directory (os error 2)")
            return httpx.Response(200, content=target.read_bytes())
        if target.is_dir():
            return error(400, "InvalidPath", f"`{target}` is a directory; PUT needs a file path")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            return error(400, "InvalidPath", f"cannot create the parent directories of `{target}`: a component is a file")
        target.write_bytes(content)
        if mode is not None:
            target.chmod(int(mode, 8))
        return httpx.Response(201, json={"path": str(target), "size": len(content)})


@pytest.fixture
def agent() -> Iterator[ShellAgent]:
    fake = ShellAgent()
    yield fake
    fake.close()


def fake_client(agent: ShellAgent) -> SandboxClient:
    return SandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(agent), retry=FAST)


@pytest.fixture
def runtime(agent: ShellAgent) -> Iterator[OrchardRuntime]:
    with fake_client(agent) as client:
        sandbox = client.connect("s1", auto_heartbeat=False)
        rt = OrchardRuntime(sandbox)
        yield rt
        rt.close_sync()


@pytest.fixture
def workdir(tmp_path: Path) -> str:
    """The fake sandbox's working directory (a local one)."""
    (tmp_path / "sandbox").mkdir()
    return str(tmp_path / "sandbox")


def raised(call: Any) -> tuple[type[BaseException], str]:
    """The type and message of the exception ``call()`` (a coroutine) raises."""
    try:
        asyncio.run(call)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    raise AssertionError("nothing was raised")


# -- the scenarios: run on the fake agent here and on the local cluster below ---------------------------


async def scenario_state_carries_over(rt: AbstractRuntime, workdir: str) -> None:
    """cwd, variables and functions carry over between ``run_in_session`` calls (multi-line commands too)."""
    first = await rt.run_in_session(BashAction(command=f"cd {workdir} && export GREETING=hello"))
    assert (first.output, first.exit_code, first.expect_string) == ("", 0, PS1), first
    carried = await rt.run_in_session(BashAction(command="pwd; echo $GREETING"))
    assert (carried.output, carried.exit_code) == (f"{workdir}\nhello\n", 0), carried
    await rt.run_in_session(BashAction(command='greet() { echo "hi $1"; }\nmkdir -p sub\ncd sub'))
    assert (await rt.run_in_session(BashAction(command="greet bob; pwd"))).output == f"hi bob\n{workdir}/sub\n"
    colored = await rt.run_in_session(BashAction(command=r"printf '\033[31mred\033[0m\r\n'"))
    assert colored.output == "red\n", "ANSI escapes stripped and CRLF as LF, like their sessions"
    await rt.run_in_session(BashAction(command=f"cd {workdir}"))


async def scenario_check_modes(rt: AbstractRuntime) -> None:
    """``check``: raise (their NonZeroExitCodeError message), silent (the exit code), ignore (None); a
    syntax error is refused before it runs; the session stays usable."""
    try:
        await rt.run_in_session(BashAction(command="echo boom; false", error_msg="make failed"))
        raise AssertionError("check=raise let a failure through")
    except NonZeroExitCodeError as e:
        assert str(e) == "make failed: Command 'echo boom; false' failed with exit code 1. Here is the output:\n'boom\\n'"
    silent = await rt.run_in_session(BashAction(command="echo out; echo err >&2; (exit 3)", check="silent"))
    assert (silent.output, silent.exit_code) == ("out\nerr\n", 3), silent
    ignored = await rt.run_in_session(BashAction(command="false", check="ignore"))
    assert (ignored.output, ignored.exit_code, ignored.expect_string) == ("", None, PS1), ignored
    try:
        await rt.run_in_session(BashAction(command="echo 'unterminated; touch ran-anyway"))
        raise AssertionError("a syntax error ran")
    except BashIncorrectSyntaxError as e:
        assert "unexpected EOF" in e.extra_info["bash_stderr"] and e.extra_info["bash_stdout"] == ""
        assert str(e).startswith("Error (exit code 2) while checking bash command \n\"echo 'unterminated; touch ran-anyway\"")
    assert (await rt.run_in_session(BashAction(command="test -e ran-anyway", check="silent"))).exit_code == 1
    assert (await rt.run_in_session(BashAction(command="echo still here"))).output == "still here\n"


async def scenario_timeout_then_interrupt(rt: AbstractRuntime, workdir: str) -> None:
    """A command past its timeout raises CommandTimeoutError; SWE-agent's BashInterruptAction that follows
    answers the output so far, and the session keeps its state."""
    try:
        await rt.run_in_session(BashAction(command="echo started; sleep 100", timeout=1))
        raise AssertionError("no timeout")
    except CommandTimeoutError as e:
        assert str(e) == "timeout after 1.0 seconds while running command 'echo started; sleep 100'"
    interrupted = await rt.run_in_session(BashInterruptAction())
    assert (interrupted.output, interrupted.exit_code, interrupted.expect_string) == ("started", 0, PS1), interrupted
    assert (await rt.run_in_session(BashAction(command="pwd"))).output == f"{workdir}\n"


async def scenario_interactive_with_expect(rt: AbstractRuntime) -> None:
    """An interactive program driven with ``expect`` (SWE-ReX's is_interactive_command and
    is_interactive_quit), and a prompt answered after a normal command stopped at an ``expect`` string."""
    started = await rt.run_in_session(BashAction(
        command="python3 -i -q", is_interactive_command=True, expect=[">>> "], timeout=60))
    assert (started.output, started.exit_code, started.expect_string) == ("", 0, ">>> "), started
    answer = await rt.run_in_session(BashAction(command="print(6 * 7)", is_interactive_command=True, expect=[">>> "], timeout=30))
    assert (answer.output, answer.expect_string) == ("42", ">>> "), answer
    block = await rt.run_in_session(BashAction(
        command="for i in range(2): print('line', i)", is_interactive_command=True, expect=[r"\.\.\. ", ">>> "], timeout=30))
    assert (block.output, block.expect_string) == ("", r"\.\.\. "), "expect strings are patterns, as pexpect's"
    loop = await rt.run_in_session(BashAction(command="", is_interactive_command=True, expect=[">>> "], timeout=30))
    assert (loop.output, loop.expect_string) == ("line 0\nline 1", ">>> "), loop
    quit = await rt.run_in_session(BashAction(command="quit()", is_interactive_quit=True, timeout=30))
    assert (quit.exit_code, quit.expect_string) == (0, PS1), quit

    asked = await rt.run_in_session(BashAction(
        command="printf 'name: '; read -r name; echo hi $name", expect=["name: "], timeout=30, check="silent"))
    assert (asked.output, asked.exit_code, asked.expect_string) == ("", None, "name: "), "still running: no exit code"
    answered = await rt.run_in_session(BashAction(command="bob", is_interactive_command=True, timeout=30))
    assert (answered.output, answered.expect_string) == ("hi bob", PS1), answered
    try:
        await rt.run_in_session(BashAction(command="printf 'go: '; read -r x", expect=["go: "], timeout=30))
        raise AssertionError("check=raise answered without an exit code")
    except NoExitCodeError:
        pass
    done = await rt.run_in_session(BashAction(command="y", timeout=30))
    assert (done.output, done.exit_code, done.expect_string) == ("", 0, PS1), "a normal command while one runs is its input"
    assert (await rt.run_in_session(BashAction(command="echo back"))).output == "back\n"


async def scenario_interrupts(rt: AbstractRuntime) -> None:
    """BashInterruptAction stops a command still running: one that dies of SIGINT, a Python REPL that
    answers it with a prompt (expect), and one that ignores it (then SIGKILL below the shell)."""
    try:
        await rt.run_in_session(BashAction(command="sleep 100", is_interactive_command=True, expect=["never"], timeout=0.5))
        raise AssertionError("no timeout")
    except CommandTimeoutError as e:
        assert str(e) == "timeout after 0.5 seconds while running command 'sleep 100'"
    stopped = await rt.run_in_session(BashInterruptAction())
    assert (stopped.exit_code, stopped.expect_string) == (0, PS1), stopped
    assert (await rt.run_in_session(BashAction(command="echo after"))).output == "after\n"

    await rt.run_in_session(BashAction(command="python3 -i -q", is_interactive_command=True, expect=[">>> "], timeout=60))
    try:
        await rt.run_in_session(BashAction(
            command="import time; time.sleep(100)", is_interactive_command=True, expect=[">>> "], timeout=0.5))
        raise AssertionError("no timeout")
    except CommandTimeoutError:
        pass
    repl = await rt.run_in_session(BashInterruptAction(expect=[">>> "]))
    assert repl.expect_string == ">>> " and "KeyboardInterrupt" in repl.output, repl
    quit = await rt.run_in_session(BashAction(command="quit()", is_interactive_quit=True, timeout=30))
    assert quit.expect_string == PS1, quit

    try:
        await rt.run_in_session(BashAction(
            command="bash -c 'trap \"\" INT; sleep 100'", is_interactive_command=True, expect=["never"], timeout=0.5))
        raise AssertionError("no timeout")
    except CommandTimeoutError:
        pass
    killed = await rt.run_in_session(BashInterruptAction(n_retry=1))
    assert (killed.exit_code, killed.expect_string) == (0, PS1), killed
    assert (await rt.run_in_session(BashAction(command="echo alive"))).output == "alive\n"


async def scenario_sessions(rt: AbstractRuntime, workdir: str) -> None:
    """Named sessions: startup files sourced, independent state, SessionExistsError and
    SessionDoesNotExistError (their messages), closing."""
    rc = f"{workdir}/rc.sh"
    await rt.write_file(WriteFileRequest(path=rc, content="export FROM_RC=yes\necho sourced\n"))
    created = await rt.create_session(CreateBashSessionRequest(session="other", startup_source=[rc], startup_timeout=30))
    assert created.output == "sourced\n", created
    assert (await rt.run_in_session(BashAction(command="echo $FROM_RC; cd /", session="other"))).output == "yes\n"
    assert (await rt.run_in_session(BashAction(command="pwd"))).output == f"{workdir}\n", "sessions are independent"
    for call, kind, message in [
        (rt.create_session(CreateBashSessionRequest(session="other")), SessionExistsError, "session other already exists"),
        (rt.run_in_session(BashAction(command="true", session="nope")), SessionDoesNotExistError, "session 'nope' does not exist"),
        (rt.run_in_session(BashInterruptAction(session="nope")), SessionDoesNotExistError, "session 'nope' does not exist"),
        (rt.close_session(CloseBashSessionRequest(session="nope")), SessionDoesNotExistError, "session 'nope' does not exist"),
    ]:
        try:
            await call
            raise AssertionError(f"{message}: nothing raised")
        except (SessionExistsError, SessionDoesNotExistError) as e:
            assert (type(e), str(e)) == (kind, message)
    await rt.close_session(CloseBashSessionRequest(session="other"))
    try:
        await rt.run_in_session(BashAction(command="true", session="other"))
        raise AssertionError("a closed session ran a command")
    except SessionDoesNotExistError:
        pass
    await rt.create_session(CreateBashSessionRequest(session="exits"))
    try:
        await rt.run_in_session(BashAction(command="exit 3", session="exits"))
        raise AssertionError("exit did not end the shell")
    except pexpect.EOF:
        pass
    try:
        await rt.run_in_session(BashAction(command="true", session="exits"))
        raise AssertionError("an exited shell ran a command")
    except pexpect.EOF:
        pass
    await rt.close_session(CloseBashSessionRequest(session="exits"))


async def scenario_execute(rt: AbstractRuntime, workdir: str) -> None:
    """``execute``: subprocess.run's semantics, ``check``, timeouts, missing programs and cwds."""
    r = await rt.execute(Command(command=["sh", "-c", "echo o; echo e >&2; exit 4"]))
    assert (r.stdout, r.stderr, r.exit_code) == ("o\n", "e\n", 4), r
    r = await rt.execute(Command(command="echo $0 $1; pwd", shell=True, cwd=workdir))
    assert (r.stdout, r.exit_code) == (f"/bin/sh\n{workdir}\n", 0), r
    r = await rt.execute(Command(command=["sh", "-c", "echo o; echo e >&2"], merge_output_streams=True))
    assert (r.stdout, r.stderr) == ("o\ne\n", ""), r
    r = await rt.execute(Command(command="echo A=$A HOME=$HOME", shell=True, env={"A": "1"}))
    assert r.stdout == "A=1 HOME=\n", "env is the whole environment, as subprocess's"
    r = await rt.execute(Command(command=["sh", "-c", "kill -9 $$"]))
    assert r.exit_code == -9, "killed by a signal: minus the signal, as subprocess"
    for command, kind, message in [
        (Command(command="exit 2", shell=True, check=True, error_msg="E"), NonZeroExitCodeError,
         "E: Command 'exit 2' failed with exit code 2. Stdout:\n''\nStderr:\n''"),
        (Command(command="sleep 30", shell=True, timeout=0.5), CommandTimeoutError,
         "Timeout (0.5s) exceeded while running command"),
        (Command(command=["no-such-program-here"]), FileNotFoundError,
         "[Errno 2] No such file or directory: 'no-such-program-here'"),
        (Command(command="echo hi"), FileNotFoundError, "[Errno 2] No such file or directory: 'echo hi'"),
        (Command(command=["pwd"], cwd="/no/such/dir"), FileNotFoundError, "[Errno 2] No such file or directory: '/no/such/dir'"),
    ]:
        try:
            await rt.execute(command)
            raise AssertionError(f"{message}: nothing raised")
        except (NonZeroExitCodeError, CommandTimeoutError, FileNotFoundError) as e:
            assert (type(e), str(e)) == (kind, message)


async def scenario_files(rt: AbstractRuntime, workdir: str, local: Path) -> None:
    """read_file/write_file (Path.read_text's decoding, parents created, their errors) and upload of a
    directory (modes and symlinks kept) and of a file."""
    path = f"{workdir}/notes/a.txt"
    await rt.write_file(WriteFileRequest(path=path, content="héllo\r\nworld\n"))
    assert (await rt.read_file(ReadFileRequest(path=path))).content == "héllo\nworld\n", "universal newlines"
    ascii_ = await rt.read_file(ReadFileRequest(path=path, encoding="ascii", errors="backslashreplace"))
    assert ascii_.content == "h\\xc3\\xa9llo\nworld\n"
    assert (await rt.run_in_session(BashAction(command="cat notes/a.txt | wc -l"))).output.strip() == "2"
    for request, kind in [(ReadFileRequest(path=f"{workdir}/missing"), FileNotFoundError),
                          (ReadFileRequest(path=f"{workdir}/notes"), IsADirectoryError)]:
        try:
            await rt.read_file(request)
            raise AssertionError(f"{request.path}: nothing raised")
        except OSError as e:
            assert type(e) is kind and e.filename == request.path, e
    try:
        await rt.write_file(WriteFileRequest(path=f"{workdir}/notes", content="x"))
        raise AssertionError("a directory was overwritten")
    except IsADirectoryError:
        pass

    bundle = local / "bundle"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "bin" / "hello").write_text("#!/bin/sh\necho hello from the bundle\n")
    (bundle / "bin" / "hello").chmod(0o755)
    (bundle / "README").write_text("read me")
    os.symlink("README", bundle / "link")
    await rt.upload(UploadRequest(source_path=str(bundle), target_path=f"{workdir}/tools/bundle"))
    ran = await rt.run_in_session(BashAction(command="tools/bundle/bin/hello; cat tools/bundle/link; test -L tools/bundle/link"))
    assert (ran.output, ran.exit_code) == ("hello from the bundle\nread me", 0), ran
    (local / "script.sh").write_text("echo script\n")
    (local / "script.sh").chmod(0o700)
    await rt.upload(UploadRequest(source_path=str(local / "script.sh"), target_path=f"{workdir}/tools"))
    copied = await rt.run_in_session(BashAction(command="tools/script.sh; stat -c %a tools/script.sh"))
    assert copied.output == "script\n700\n", "into the directory, its mode kept (shutil.copy)"
    try:
        await rt.upload(UploadRequest(source_path=str(local / "missing"), target_path=f"{workdir}/x"))
        raise AssertionError("a missing source uploaded")
    except FileNotFoundError:
        pass


async def run_scenarios(rt: AbstractRuntime, workdir: str, local: Path) -> None:
    await scenario_state_carries_over(rt, workdir)
    await scenario_check_modes(rt)
    await scenario_timeout_then_interrupt(rt, workdir)
    await scenario_interactive_with_expect(rt)
    await scenario_interrupts(rt)
    await scenario_sessions(rt, workdir)
    await scenario_execute(rt, workdir)
    await scenario_files(rt, workdir, local)


# -- on the fake agent ------------------------------------------------------------------------------------


async def test_state_carries_over(runtime: OrchardRuntime, workdir: str) -> None:
    await runtime.create_session(CreateBashSessionRequest())
    await scenario_state_carries_over(runtime, workdir)


async def test_check_modes(runtime: OrchardRuntime, workdir: str) -> None:
    await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(BashAction(command=f"cd {workdir}"))
    await scenario_check_modes(runtime)


async def test_a_timeout_then_the_interrupt_swe_agent_sends(runtime: OrchardRuntime, workdir: str, agent: ShellAgent) -> None:
    await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(BashAction(command=f"cd {workdir}"))
    await scenario_timeout_then_interrupt(runtime, workdir)
    runs = agent.sent("POST", f"/sessions/{next(iter(agent.sessions))}/run")
    assert {"command": "echo started; sleep 100", "timeoutMs": 1000} in runs, "the timeout is the run's"
    signals = [r for m, r, _ in agent.calls if r.endswith("/signal")]
    assert not signals, "the agent interrupted it: no signal sent"


async def test_an_interactive_program_with_expect(runtime: OrchardRuntime, agent: ShellAgent) -> None:
    await runtime.create_session(CreateBashSessionRequest())
    await scenario_interactive_with_expect(runtime)
    id = next(iter(agent.sessions))
    assert {"text": "print(6 * 7)\n"} in agent.sent("POST", f"/sessions/{id}/input"), "the line went to the program"
    assert {"until": ">>> ", "timeoutMs": 500} in agent.sent("POST", f"/sessions/{id}/read"), "a literal is the agent's until"


async def test_a_background_command_answers_only_its_own_output(runtime: OrchardRuntime, agent: ShellAgent) -> None:
    """A command started in the background (``expect``, interactive) answers its own output: not what the
    previous run left readable at the agent, nor a ``set -x`` trace of the start; one that never starts
    (a syntax error, unchecked for interactive commands) answers the shell's message."""
    await runtime.create_session(CreateBashSessionRequest())
    assert (await runtime.run_in_session(BashAction(command="echo previous"))).output == "previous\n"
    asked = await runtime.run_in_session(BashAction(command="printf 'x: '; read -r x; echo got $x", expect=["x: "], timeout=30, check="silent"))
    assert asked.output == "" and asked.expect_string == "x: ", asked
    assert (await runtime.run_in_session(BashAction(command="1", is_interactive_command=True, timeout=30))).output == "got 1"
    await runtime.run_in_session(BashAction(command="set -x"))
    traced = await runtime.run_in_session(BashAction(command="echo hi; sleep 0.2", is_interactive_command=True, timeout=30))
    assert "__swerex_start_" not in traced.output and "hi" in traced.output, traced
    await runtime.run_in_session(BashAction(command="set +x", check="silent"))
    broken = await runtime.run_in_session(BashAction(command="echo (", is_interactive_command=True, timeout=30))
    assert broken.expect_string == PS1 and "syntax error" in broken.output, broken
    assert (await runtime.run_in_session(BashAction(command="echo fine"))).output == "fine\n"


async def test_interrupts_are_the_sessions_signals(runtime: OrchardRuntime, agent: ShellAgent) -> None:
    await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(BashAction(command="sleep 300 & echo $! > /dev/null", timeout=30))
    await scenario_interrupts(runtime)
    id = next(iter(agent.sessions))
    assert agent.sent("POST", f"/sessions/{id}/signal") == [{"signal": "INT"}] * 3 + [{"signal": "KILL"}], (
        "SIGINT for each; SIGKILL below the shell for the one ignoring it")
    assert not [b for b in agent.sent("POST", "/exec") if "kill" in str(b)], "no exec of kill any more"
    # The `&` job of an earlier run got neither signal.
    shell = agent.sessions[id].proc.pid
    assert any(parent == shell for parent in processes().values()), "the shell's `&` job still runs"


async def test_sessions(runtime: OrchardRuntime, workdir: str) -> None:
    await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(BashAction(command=f"cd {workdir}"))
    await scenario_sessions(runtime, workdir)


async def test_execute(runtime: OrchardRuntime, workdir: str) -> None:
    await scenario_execute(runtime, workdir)


async def test_files_and_upload(runtime: OrchardRuntime, workdir: str, tmp_path: Path) -> None:
    await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(BashAction(command=f"cd {workdir}"))
    (tmp_path / "local").mkdir()
    await scenario_files(runtime, workdir, tmp_path / "local")


async def test_every_scenario_in_one_session_as_on_the_cluster(runtime: OrchardRuntime, workdir: str, tmp_path: Path) -> None:
    await runtime.create_session(CreateBashSessionRequest(startup_timeout=30))
    await runtime.run_in_session(BashAction(command=f"cd {workdir}", timeout=30))
    (tmp_path / "local").mkdir()
    await run_scenarios(runtime, workdir, tmp_path / "local")


def test_errors_are_swe_rexs_local_runtime_errors(runtime: OrchardRuntime, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The same failures through SWE-ReX's LocalRuntime and OrchardRuntime raise the same type and message
    (each call in an asyncio.run of its own, as SWE-agent makes them)."""
    monkeypatch.setenv("TERM", "dumb")  # their bash runs on a terminal: no bracketed-paste escapes in its output
    local = LocalRuntime()
    for rt in (local, runtime):
        asyncio.run(rt.create_session(CreateBashSessionRequest()))
    calls = [
        lambda rt: rt.run_in_session(BashAction(command="echo boom; exit_code_7() { return 7; }; exit_code_7", error_msg="E")),
        lambda rt: rt.run_in_session(BashAction(command="sleep 5", timeout=0.3)),
        lambda rt: rt.run_in_session(BashAction(command="true", session="missing")),
        lambda rt: rt.create_session(CreateBashSessionRequest()),
        lambda rt: rt.close_session(CloseBashSessionRequest(session="missing")),
        lambda rt: rt.execute(Command(command="exit 3", shell=True, check=True)),
        lambda rt: rt.execute(Command(command=["sleep", "5"], timeout=0.3)),
        lambda rt: rt.execute(Command(command=["no-such-program-here"])),
        lambda rt: rt.execute(Command(command=["true"], cwd=str(tmp_path / "no-dir"))),
        lambda rt: rt.read_file(ReadFileRequest(path=str(tmp_path / "missing"))),
        lambda rt: rt.read_file(ReadFileRequest(path=str(tmp_path))),
    ]
    try:
        for call in calls:
            theirs, ours = raised(call(local)), raised(call(runtime))
            assert ours == theirs, (ours, theirs)
            if ours[0] is CommandTimeoutError and "sleep 5'" in ours[1]:
                asyncio.run(local.run_in_session(BashInterruptAction()))  # theirs keeps running until then
        syntax = [raised(rt.run_in_session(BashAction(command="if then fi"))) for rt in (local, runtime)]
        assert syntax[0][0] is syntax[1][0] is BashIncorrectSyntaxError
        assert syntax[0][1].split("---- Stderr ----")[0] == syntax[1][1].split("---- Stderr ----")[0]
    finally:
        asyncio.run(local.close())


def test_each_call_may_come_from_its_own_event_loop(runtime: OrchardRuntime) -> None:
    """SWE-agent wraps every runtime call in asyncio.run: no state is bound to an event loop."""
    asyncio.run(runtime.create_session(CreateBashSessionRequest()))
    asyncio.run(runtime.run_in_session(BashAction(command="export X=1")))
    assert asyncio.run(runtime.run_in_session(BashAction(command="echo $X"))).output == "1\n"
    assert asyncio.run(runtime.is_alive(timeout=10)).is_alive


def test_session_and_exec_settings_are_sent(agent: ShellAgent) -> None:
    with fake_client(agent) as client:
        rt = OrchardRuntime(client.connect("s1", auto_heartbeat=False), shell="/bin/bash", cwd="/tmp",
                            env={"LANG": "C.UTF-8"}, max_output_bytes=1 << 20, user=None, syntax_check="off")
        asyncio.run(rt.create_session(CreateBashSessionRequest()))
        assert asyncio.run(rt.run_in_session(BashAction(command="echo $LANG; pwd", timeout=5))).output == "C.UTF-8\n/tmp\n"
        asyncio.run(rt.run_in_session(BashAction(command="if then fi", check="silent")))  # not checked: bash's own error
        asyncio.run(rt.execute(Command(command="true", shell=True)))
        rt.close_sync()
    assert agent.sent("POST", "/sessions") == [
        {"shell": "/bin/bash", "cwd": "/tmp", "env": {"LANG": "C.UTF-8"}, "maxOutputBytes": 1 << 20}]
    assert agent.sent("POST", "/exec") == [{"command": "true", "timeoutSeconds": 86_370.0}], (
        "syntax_check off: no bash -n; no timeout: a day")


def test_user_goes_to_sessions_and_commands_and_syntax_checks(agent: ShellAgent) -> None:
    with fake_client(agent) as client:
        rt = OrchardRuntime(client.connect("s1", auto_heartbeat=False), user=os.getuid())
        asyncio.run(rt.create_session(CreateBashSessionRequest()))
        asyncio.run(rt.run_in_session(BashAction(command="true")))
        asyncio.run(rt.execute(Command(command=["true"])))
        rt.close_sync()
    assert agent.sent("POST", "/sessions")[0]["user"] == str(os.getuid())
    assert [(b.get("argv"), b.get("user")) for b in agent.sent("POST", "/exec")] == [
        (["bash", "-n"], str(os.getuid())), (["true"], str(os.getuid()))]


def test_syntax_checks_can_run_here_or_not_at_all(agent: ShellAgent) -> None:
    with fake_client(agent) as client:
        sandbox = client.connect("s1", auto_heartbeat=False)
        local = OrchardRuntime(sandbox, syntax_check="local")
        asyncio.run(local.create_session(CreateBashSessionRequest()))
        kind, _ = raised(local.run_in_session(BashAction(command="if then fi")))
        assert kind is BashIncorrectSyntaxError
        local.close_sync()
    assert not [b for b in agent.sent("POST", "/exec") if b.get("argv") == ["bash", "-n"]], "checked here"


# -- the deployment, on the fake gateway ------------------------------------------------------------------


class Steps(DeploymentHook):
    def __init__(self) -> None:
        self.steps: list[str] = []

    def on_custom_step(self, message: str) -> None:
        self.steps.append(message)


def test_deployment_start_creates_a_sandbox_and_stop_deletes_it(agent: ShellAgent) -> None:
    hook = Steps()
    with fake_client(agent) as client:
        deployment = OrchardDeployment(
            client=client, image="python:3.11", cpu="2", memory="4Gi", network="Deny", ttl_seconds=3600,
            heartbeat_timeout_seconds=300, labels={"suite": "swerex"}, env={"PIP_NO_INPUT": "1"},
            working_dir="/work", spec_fields={"node_selector": {"pool": "cpu"}},
        )
        deployment.add_hook(hook)
        with pytest.raises(DeploymentNotStartedError):
            deployment.runtime  # noqa: B018
        with pytest.raises(DeploymentNotStartedError):
            asyncio.run(deployment.is_alive())
        asyncio.run(deployment.start())
        assert deployment.sandbox.name == "s1"
        assert asyncio.run(deployment.is_alive()).is_alive
        asyncio.run(deployment.runtime.create_session(CreateBashSessionRequest()))
        assert asyncio.run(deployment.runtime.run_in_session(BashAction(command="echo up"))).output == "up\n"
        asyncio.run(deployment.start())  # again: ignored, as theirs
        asyncio.run(deployment.stop())
        with pytest.raises(DeploymentNotStartedError):
            deployment.runtime  # noqa: B018
        with pytest.raises(DeploymentNotStartedError):
            asyncio.run(deployment.is_alive())
        asyncio.run(deployment.stop())  # again: nothing
    assert agent.created == [{
        "generateName": "swerex-", "labels": {"suite": "swerex"}, "image": "python:3.11", "env": {"PIP_NO_INPUT": "1"},
        "cpu": "2", "memory": "4Gi", "ttlSeconds": 3600, "heartbeatTimeoutSeconds": 300, "network": {"egress": "Deny"},
        "workingDir": "/work", "nodeSelector": {"pool": "cpu"},
    }]
    assert agent.deleted == 1, "stop deleted the sandbox, once"
    assert agent.sessions == {}, "stop closed the sessions"
    assert hook.steps == ["Creating sandbox", "Sandbox Ready (SandboxReady)", "Starting runtime"]


def test_a_sandbox_that_cannot_start_is_a_startup_error_and_is_deleted() -> None:
    agent = ShellAgent(wait=STALLED)
    hook = Steps()
    with fake_client(agent) as client:
        deployment = OrchardDeployment(client=client, pool="py")
        deployment.add_hook(hook)
        with pytest.raises(DeploymentStartupError, match="PoolNotFound") as e:
            asyncio.run(deployment.start())
        assert type(e.value.__cause__).__name__ == "SandboxStalled"
        with pytest.raises(DeploymentNotStartedError):
            deployment.runtime  # noqa: B018
    assert agent.created == [{"generateName": "swerex-", "pool": "py"}], "a pool claim keeps the pool's lifecycle"
    assert agent.deleted == 1
    assert hook.steps[-1] == "Sandbox Pending (PoolNotFound)"


def test_an_existing_sandbox_is_used_and_never_deleted(agent: ShellAgent) -> None:
    with fake_client(agent) as client:
        by_name = OrchardDeployment(client=client, sandbox="s1", namespace="ns")
        asyncio.run(by_name.start())
        assert asyncio.run(by_name.is_alive()).is_alive
        asyncio.run(by_name.stop())
        handle = client.connect("s1", auto_heartbeat=False)
        given = OrchardDeployment(sandbox=handle)
        asyncio.run(given.start())
        assert given.sandbox is handle and given.config.sandbox == "s1" and given.config.namespace == "ns"
        asyncio.run(given.stop())
    assert agent.created == [] and agent.deleted == 0


def test_the_config_builds_the_deployment_like_swe_rexs_configs(monkeypatch: pytest.MonkeyPatch, agent: ShellAgent) -> None:
    config = OrchardDeploymentConfig(image="python:3.11", namespace="ns", runtime={"syntax_check": "off", "cwd": "/w"})
    assert config.model_dump()["type"] == "orchard"
    assert not {"token", "auth_token"} & set(config.model_dump()), "no token in the config (SWE-agent saves configs)"
    with pytest.raises(ValueError, match="extra"):
        OrchardDeploymentConfig(image="x", tokn="t")  # type: ignore[call-arg]
    monkeypatch.setenv("ORCHARD_GATEWAY_URL", "http://gw")
    monkeypatch.setenv("ORCHARD_TOKEN", "t")
    real = SandboxClient.__init__

    def with_fake_transport(self: SandboxClient, *args: Any, **kwargs: Any) -> None:
        real(self, *args, transport=httpx.MockTransport(agent), retry=FAST, **kwargs)

    monkeypatch.setattr(SandboxClient, "__init__", with_fake_transport)
    deployment = get_deployment(config)  # type: ignore[arg-type]  (SWE-ReX's own helper)
    assert isinstance(deployment, OrchardDeployment) and deployment.config == config
    asyncio.run(deployment.start())
    assert deployment.runtime._config.cwd == "/w" and deployment.runtime._config.syntax_check == "off"
    asyncio.run(deployment.stop())
    assert deployment._own_client is None, "the client it made is closed"
    assert agent.deleted == 1


def test_is_alive_reports_a_sandbox_that_is_gone(agent: ShellAgent) -> None:
    with fake_client(agent) as client:
        rt = OrchardRuntime(client.connect("s1", auto_heartbeat=False))
        assert asyncio.run(rt.is_alive()).is_alive
        client.delete("s1")
        alive = asyncio.run(rt.is_alive())
        assert not alive and "not found" in alive.message, alive


def test_the_cluster_test_runs_on_the_fake_gateway(agent: ShellAgent, tmp_path: Path) -> None:
    """The cluster test below, as written, with the fake gateway and agent standing in for the cluster."""
    cluster = Cluster(gateway="http://gw", token="t", namespace="ns", other_namespace="other", bob_token="b",
                      kube_server="", kube_ca="", metrics_url="", python_image="python:3.11")
    with fake_client(agent) as client:
        test_swe_rex_on_a_real_sandbox(client, cluster, tmp_path)
    assert agent.created[0]["image"] == "python:3.11" and agent.deleted == 1


def harnesses_block() -> str:
    """The first Python block of the "SWE-ReX" section of docs/HARNESSES.md, as it is written there."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "HARNESSES.md").read_text()
    section = doc.split("## SWE-ReX\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def run_harnesses_block(monkeypatch: pytest.MonkeyPatch, gateway: str, token: str, namespace: str,
                        replacements: dict[str, str] | None = None) -> None:
    block = harnesses_block()
    for old, new in (replacements or {}).items():
        block = block.replace(old, new)
    monkeypatch.setenv("ORCHARD_GATEWAY_URL", gateway)
    monkeypatch.setenv("ORCHARD_TOKEN", token)
    monkeypatch.setenv("ORCHARD_NAMESPACE", namespace)
    exec(compile(block, "docs/HARNESSES.md", "exec"), {"__name__": "harnesses_md"})


def test_the_docs_block_runs_on_the_fake_gateway(agent: ShellAgent, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    real = SandboxClient.__init__

    def with_fake_transport(self: SandboxClient, *args: Any, **kwargs: Any) -> None:
        real(self, *args, transport=httpx.MockTransport(agent), retry=FAST, **kwargs)

    monkeypatch.setattr(SandboxClient, "__init__", with_fake_transport)
    run_harnesses_block(monkeypatch, "http://gw", "t", "ns")
    assert capsys.readouterr().out.splitlines() == ["/tmp", "hello", "42"]
    assert agent.created[0]["image"] == "python:3.11" and agent.created[0]["ttlSeconds"] == 1800
    assert agent.deleted == 1 and agent.sessions == {}


# -- on the local cluster ------------------------------------------------------------------------------------


@pytest.mark.cluster
def test_the_docs_block_runs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The SWE-ReX block of docs/HARNESSES.md, as it is written there (the Python image of the cluster)."""
    run_harnesses_block(monkeypatch, cluster.gateway, cluster.token, cluster.namespace,
                        {'"python:3.11"': repr(cluster.python_image)})
    assert capsys.readouterr().out.splitlines() == ["/tmp", "hello", "42"]



@pytest.mark.cluster
def test_swe_rex_on_a_real_sandbox(client: SandboxClient, cluster: Cluster, tmp_path: Path) -> None:
    """Every scenario above in a sandbox of the Python image (``debian-python`` on the real node), through
    OrchardDeployment: start creates and waits, is_alive, stop deletes."""
    hook = Steps()
    deployment = OrchardDeployment(client=client, image=cluster.python_image, ttl_seconds=900,
                                   labels={"suite": "sdk-swerex"})
    deployment.add_hook(hook)

    # Unique: on the hollow node sandboxes share the host's file system.
    workdir = f"/tmp/swerex-{uuid.uuid4().hex[:12]}"

    async def scenarios() -> None:
        rt = deployment.runtime
        assert (await deployment.is_alive(timeout=60)).is_alive
        await rt.create_session(CreateBashSessionRequest(startup_timeout=30))
        await rt.run_in_session(BashAction(command=f"mkdir -p {workdir} && cd {workdir}", timeout=30))
        (tmp_path / "local").mkdir()
        try:
            await run_scenarios(rt, workdir, tmp_path / "local")
        finally:
            await rt.execute(Command(command=["rm", "-rf", workdir], timeout=60))

    asyncio.run(deployment.start())
    name = deployment.sandbox.name
    try:
        asyncio.run(scenarios())
    finally:
        asyncio.run(deployment.stop())
    assert hook.steps[0] == "Creating sandbox" and hook.steps[-1] == "Starting runtime", hook.steps
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if client.get(name)["metadata"].get("deletionTimestamp"):
                break
        except NotFound:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"sandbox {name} was not deleted by stop()")
