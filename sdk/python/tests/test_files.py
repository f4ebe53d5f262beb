"""File transfers without str/path ambiguity (sync and async, fake agent behind a fake gateway, no
cluster): ``upload`` writes content (bytes or text), ``upload_file`` copies a local path or a binary file
object, ``download`` answers bytes, ``download_file`` writes to a local path or a binary file object."""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import DRIVERS, sandbox_of

FILES = "/v1/namespaces/ns/sandboxes/s1/files"
READY = {"metadata": {"name": "s1"}, "spec": {"image": "x"},
         "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}


class Agent:
    """The sandbox's files behind the gateway; ``fail_puts`` first PUTs answer a retryable 503."""

    def __init__(self, fail_puts: int = 0) -> None:
        self.files: dict[str, bytes] = {}
        self.puts: list[tuple[str, bytes, str | None]] = []
        self.fail_puts = fail_puts

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/namespaces/ns/sandboxes/s1":
            return httpx.Response(200, json=READY)
        path = request.url.params.get("path", "")
        if request.url.path == FILES and request.method == "PUT":
            self.puts.append((path, request.content, request.url.params.get("mode")))
            if len(self.puts) <= self.fail_puts:
                return httpx.Response(503, json={"code": "AgentUnavailable", "message": "busy", "retryable": True})
            self.files[path] = request.content
            return httpx.Response(200, json={"path": path, "size": len(request.content)})
        if request.url.path == FILES and request.method == "GET":
            if path not in self.files:
                return httpx.Response(404, json={"code": "NotFound", "message": path})
            return httpx.Response(200, content=self.files[path])
        return httpx.Response(404, json={"code": "NotFound", "message": request.url.path})



async def done(value: Any) -> Any:
    """The result of a sync call, or of an async call's awaitable. Here, not in conftest: the deprecation
    warnings point at the frame that makes the call, which the tests check is this file."""
    return await value if inspect.isawaitable(value) else value


@DRIVERS
async def test_upload_writes_content_and_a_str_is_text(mode: str) -> None:
    agent = Agent()
    async with sandbox_of(mode, agent) as sbx:
        assert await done(sbx.upload("/work/a.txt", "data.csv")) == {"path": "/work/a.txt", "size": 8}
        assert await done(sbx.upload("/work/b.bin", b"\x00\xff", mode=0o755)) == {"path": "/work/b.bin", "size": 2}
        await done(sbx.upload("/work/c.txt", "é", mode="0600"))
    assert agent.files == {"/work/a.txt": b"data.csv", "/work/b.bin": b"\x00\xff", "/work/c.txt": "é".encode()}
    assert [mode_ for _, _, mode_ in agent.puts] == [None, "755", "0600"]


@DRIVERS
async def test_upload_of_a_local_path_is_a_type_error_naming_upload_file(mode: str, tmp_path: Path) -> None:
    agent = Agent()
    local = tmp_path / "data.csv"
    local.write_bytes(b"a,b\n")
    async with sandbox_of(mode, agent) as sbx:
        with pytest.raises(TypeError, match=r"is a local path: use upload_file\(path, local_path\)"):
            await done(sbx.upload("/srv/data.csv", local))
        with pytest.raises(TypeError, match="takes bytes or str, not NoneType"):
            await done(sbx.upload("/srv/data.csv", None))
    assert agent.puts == [], "nothing was sent"


@DRIVERS
async def test_upload_file_copies_a_path_a_str_path_or_a_file_object(mode: str, tmp_path: Path) -> None:
    agent = Agent()
    local = tmp_path / "data.csv"
    local.write_bytes(b"a,b\n" * 100_000)
    stream = io.BytesIO(b"skip:file object")
    stream.seek(5)
    async with sandbox_of(mode, agent) as sbx:
        assert (await done(sbx.upload_file("/srv/1.csv", local)))["size"] == 400_000
        await done(sbx.upload_file("/srv/2.csv", str(local), mode=0o600))
        await done(sbx.upload_file("/srv/3.bin", stream))
        with pytest.raises(TypeError, match="binary file object"):
            await done(sbx.upload_file("/srv/4.txt", io.StringIO("text mode")))
        with pytest.raises(TypeError, match=r"use upload\(path, data\)"):
            await done(sbx.upload_file("/srv/5.txt", b"content"))
    assert agent.files == {"/srv/1.csv": local.read_bytes(), "/srv/2.csv": local.read_bytes(), "/srv/3.bin": b"file object"}


@DRIVERS
async def test_a_retried_upload_file_sends_the_file_object_again_from_its_start(mode: str) -> None:
    agent = Agent(fail_puts=1)
    stream = io.BytesIO(b"head|body")
    stream.seek(5)
    async with sandbox_of(mode, agent) as sbx:
        await done(sbx.upload_file("/x.bin", stream))
    assert [content for _, content, _ in agent.puts] == [b"body", b"body"]


@DRIVERS
async def test_upload_of_a_file_object_still_works_but_is_deprecated(mode: str) -> None:
    agent = Agent()
    async with sandbox_of(mode, agent) as sbx:
        with pytest.warns(DeprecationWarning, match=r"use upload_file\(path, file_object\)") as caught:
            await done(sbx.upload("/x.bin", io.BytesIO(b"old call")))
    assert agent.files == {"/x.bin": b"old call"}
    assert caught[0].filename == __file__, "the warning points at the caller"


@DRIVERS
async def test_download_answers_bytes_and_download_file_writes_a_path_or_a_file_object(mode: str, tmp_path: Path) -> None:
    agent = Agent()
    payload = bytes(range(256)) * 4096
    agent.files["/out/blob.bin"] = payload
    target = tmp_path / "blob.bin"
    sink = io.BytesIO(b"keep:")
    sink.seek(5)
    async with sandbox_of(mode, agent) as sbx:
        assert await done(sbx.download("/out/blob.bin")) == payload
        assert await done(sbx.download_file("/out/blob.bin", target)) == len(payload)
        assert await done(sbx.download_file("/out/blob.bin", str(tmp_path / "again.bin"))) == len(payload)
        assert await done(sbx.download_file("/out/blob.bin", sink)) == len(payload)
        with pytest.raises(TypeError, match="binary file object"):
            await done(sbx.download_file("/out/blob.bin", io.StringIO()))
    assert target.read_bytes() == payload and (tmp_path / "again.bin").read_bytes() == payload
    assert not sink.closed and sink.getvalue() == b"keep:" + payload, "a file object is written from its position and left open"


@DRIVERS
async def test_download_with_dest_still_works_but_is_deprecated(mode: str, tmp_path: Path) -> None:
    agent = Agent()
    agent.files["/a"] = b"abc"
    async with sandbox_of(mode, agent) as sbx:
        with pytest.warns(DeprecationWarning, match=r"use download_file\(path, dest\)") as caught:
            assert await done(sbx.download("/a", tmp_path / "a")) == 3
    assert (tmp_path / "a").read_bytes() == b"abc"
    assert caught[0].filename == __file__, "the warning points at the caller"
