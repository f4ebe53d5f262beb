"""The full sandbox lifecycle through the gateway with the sync client (local cluster, real operator)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from orchard_env import CommandFailed, Conflict, NotFound, PatchConflict, SandboxClient

from conftest import Cluster


def wait_gone(client: SandboxClient, name: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            client.get(name)
        except NotFound:
            return
        time.sleep(0.2)
    pytest.fail(f"sandbox {name} still exists {seconds}s after the handle closed")


def test_sandbox_lifecycle(client: SandboxClient, cluster: Cluster, tmp_path: Path) -> None:
    with client.create(
        image=cluster.python_image, env={"GREETING": "hi"}, labels={"suite": "sdk"}, ttl_seconds=600
    ) as sbx:
        assert sbx.phase == "Ready"
        assert sbx.agent_endpoint and sbx.agent_endpoint.startswith("http://")
        assert any(s["metadata"]["name"] == sbx.name for s in client.list(label_selector="suite=sdk"))

        # exec: argv, shell string, env, cwd, stdin (text and bytes), exit codes, timeouts
        assert sbx.exec(["echo", "hello"]).stdout == "hello\n"
        result = sbx.exec("echo $GREETING $EXTRA; pwd", env={"EXTRA": "there"}, cwd="/tmp")
        assert result.ok and result.stdout == "hi there\n/tmp\n"
        assert sbx.exec(["cat"], stdin=b"\x00raw\xff").raw["stdout"].startswith("\x00raw")
        failed = sbx.exec("echo boom >&2; exit 4")
        assert failed.exit_code == 4 and failed.stderr == "boom\n" and not failed.ok
        with pytest.raises(CommandFailed):
            sbx.exec("exit 1", check=True)
        slow = sbx.exec(["sleep", "10"], timeout=1)
        assert slow.timed_out and slow.duration < 5
        capped = sbx.exec("head -c 100000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
        assert capped.stdout_truncated and len(capped.stdout) == 1000

        # streaming: events arrive while the command runs. The command waits for a file this test
        # creates only once it has seen the first output: were the events held back until the command
        # ended, it would be killed at its time-out without printing "two".
        events = []
        released = False
        for event in sbx.exec_stream("echo one; while [ ! -e go-stream ]; do sleep 0.05; done; echo two", timeout=60):
            events.append(event)
            if event.type == "stdout" and not released:
                assert sbx.exec(["touch", "go-stream"]).ok
                released = True
        assert [e.type for e in events][0] == "started"
        assert events[-1].type == "exit" and events[-1].exit_code == 0, events[-1]
        assert "".join(e.data for e in events if e.type == "stdout") == "one\ntwo\n"

        # files: bytes and text up, a local path and a file object up; bytes, a local file and a file object down
        payload = bytes(range(256)) * 4096  # 1 MiB
        assert sbx.upload("data/blob.bin", payload)["size"] == len(payload)
        assert sbx.download("data/blob.bin") == payload
        local = tmp_path / "in.txt"
        local.write_text("from a path\n")
        sbx.upload_file("data/path.txt", local)
        assert sbx.upload("data/text.txt", "in.txt", mode=0o600)["size"] == 6, "a str is content"
        sbx.upload_file("data/obj.bin", io.BytesIO(b"file object"))
        out = tmp_path / "out.bin"
        assert sbx.download_file("data/blob.bin", out) == len(payload)
        assert out.read_bytes() == payload
        sink = io.BytesIO()
        assert sbx.download_file("data/path.txt", sink) == 12 and sink.getvalue() == b"from a path\n"
        entries = {e.name: e for e in sbx.list_files("data")}
        assert set(entries) == {"blob.bin", "obj.bin", "path.txt", "text.txt"}
        assert entries["text.txt"].mode == 0o600 and entries["blob.bin"].type == "file"
        sbx.delete_file("data/obj.bin")
        with pytest.raises(NotFound):
            sbx.download("data/obj.bin")
        sbx.delete_file("data", recursive=True)

        # patches
        sbx.upload("repo/a.txt", "one\ntwo\n")
        diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
        applied = sbx.apply_patch(diff, cwd="repo")
        assert applied.files == [{"path": "a.txt", "action": "modified"}]
        assert sbx.download("repo/a.txt") == b"one\n2\n"
        with pytest.raises(PatchConflict) as conflict:
            sbx.apply_patch(diff, cwd="repo")
        assert conflict.value.failed_hunks

        # background processes
        server = sbx.start_process(["sleep", "60"], id="server")
        assert server.info is not None and server.info.running
        assert [p.id for p in sbx.list_processes()] == ["server"]
        server.signal("TERM")
        final = server.wait(timeout=10)
        assert final.state == "exited"
        job = sbx.start_process("echo done")
        assert job.wait(timeout=10).stdout == "done\n"
        assert job.kill().state == "exited"
        with pytest.raises(NotFound):
            sbx.get_process(job.id)

        # the trajectory result, write-once
        recorded = sbx.record_result(1.0, length=42, artifact="s3://bucket/run-1")
        assert recorded["result"]["reward"] == 1.0
        with pytest.raises(Conflict) as again:
            sbx.record_result(0.0)
        assert again.value.code == "ResultAlreadyRecorded"
        name = sbx.name
    wait_gone(client, name)


def test_direct_mode_talks_to_the_agent_at_the_pod_ip(cluster: Cluster) -> None:
    if not cluster.direct:
        pytest.skip("agents are reachable only from the operator's pods here (NetworkPolicies are enforced)")
    import httpx

    route = 'route="/v1/namespaces/{namespace}/sandboxes/{name}/exec"'

    def gateway_execs() -> float:
        text = httpx.get(cluster.metrics_url, timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("orchard_gateway_requests_total{") and route in line
        )

    # The agent's address and token come from the gateway (RBAC get on sandboxes/token).
    with SandboxClient(cluster.gateway, cluster.token, namespace=cluster.namespace, direct=True) as client:
        with client.create(image=cluster.image) as sbx:
            before = gateway_execs()
            for _ in range(5):
                assert sbx.exec(["echo", "direct"]).stdout == "direct\n"
            sbx.upload("d.txt", b"direct bytes")
            assert sbx.download("d.txt") == b"direct bytes"
            assert gateway_execs() == before, "direct mode must bypass the gateway"
            name = sbx.name
        wait_gone(client, name)


def test_the_quick_start_runs(client: SandboxClient, cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """The quick start of docs/SDK.md, as it is written there (its client configured by the environment)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "SDK.md").read_text()
    block = doc.split("## Quick start", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("ORCHARD_GATEWAY_URL", cluster.gateway)
    monkeypatch.setenv("ORCHARD_TOKEN", cluster.token)
    monkeypatch.setenv("ORCHARD_NAMESPACE", cluster.namespace)
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    try:
        exec(compile(block.replace('"python:3.11"', repr(cluster.python_image)), "docs/SDK.md", "exec"), scope)
    finally:
        if isinstance(scope.get("client"), SandboxClient):
            scope["client"].close()
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == ["0 42", "", "['calc.py', 'test_calc.py']", "True"], out
    assert (tmp_path / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    stream = " ".join(out[4:]).split()
    assert stream[0] == "started" and stream[-1] == "exit" and [w for w in stream if w.isdigit()] == ["1", "2", "3"], out
    wait_gone(client, scope["sbx"].name)
