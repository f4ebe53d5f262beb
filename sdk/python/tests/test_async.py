"""The asyncio client against the local cluster: lifecycle, streaming, concurrency, cleanup."""

from __future__ import annotations

import asyncio
import io

import pytest

from orchard_env import AsyncSandboxClient, NotFound

from conftest import Cluster


async def test_async_lifecycle_and_concurrency(aclient: AsyncSandboxClient, cluster: Cluster) -> None:
    async with aclient.create(image=cluster.python_image, ttl_seconds=600) as sbx:
        assert sbx.phase == "Ready"
        results = await asyncio.gather(*(sbx.exec(["echo", str(i)]) for i in range(16)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(16)]
        events = [e async for e in sbx.exec_stream("echo a; echo b >&2")]
        assert events[0].type == "started" and events[-1].type == "exit"
        assert {e.type for e in events} >= {"stdout", "stderr"}
        await sbx.upload("x/y.bin", b"async bytes")
        assert await sbx.download("x/y.bin") == b"async bytes"
        sink = io.BytesIO()
        assert await sbx.download_file("x/y.bin", sink) == 11 and sink.getvalue() == b"async bytes"
        await sbx.upload_file("x/z.bin", io.BytesIO(b"from a file object"))
        assert await sbx.download("x/z.bin") == b"from a file object"
        assert [e.name for e in await sbx.list_files("x")] == ["y.bin", "z.bin"]
        process = await sbx.start_process("sleep 30", id="bg")
        await process.signal("KILL")
        assert (await process.wait(timeout=10)).state == "exited"
        patched = await sbx.apply_patch("--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n", cwd="x")
        assert patched.files[0]["action"] == "created"
        name = sbx.name
    for _ in range(150):
        try:
            await aclient.get(name)
        except NotFound:
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail("sandbox not deleted on async context exit")


async def test_awaited_create_and_explicit_close(aclient: AsyncSandboxClient, cluster: Cluster) -> None:
    sbx = await aclient.create(image=cluster.image, delete_on_exit=False)
    try:
        assert (await sbx.exec("echo kept")).stdout == "kept\n"
    finally:
        await sbx.close()
    assert (await aclient.get(sbx.name))["status"]["phase"] == "Ready", "delete_on_exit=False keeps it"
    await aclient.delete(sbx.name)
