"""Automatic heartbeats keep an open handle's sandbox alive past its heartbeat timeout; once the handle
stops beating, the sandbox expires (local cluster, real operator)."""

from __future__ import annotations

import time

import pytest

from orchard_env import NotFound, SandboxClient

from conftest import Cluster


def test_open_handles_keep_sandboxes_alive(client: SandboxClient, cluster: Cluster) -> None:
    timeout = 6
    with client.create(
        image=cluster.image, heartbeat_timeout_seconds=timeout, ttl_seconds=600, delete_on_exit=False
    ) as sbx:
        # No calls at all for more than twice the timeout: only the background heartbeats.
        time.sleep(2.5 * timeout)
        alive = client.get(sbx.name)
        assert alive["status"]["phase"] == "Ready"
        assert alive["status"].get("lastHeartbeatTime"), alive["status"]
    # The handle closed without deleting: heartbeats stop and the sandbox expires.
    closed = time.monotonic()
    while time.monotonic() - closed < timeout + 15:
        try:
            client.get(sbx.name)
        except NotFound:
            print(f"expired {time.monotonic() - closed:.1f}s after the handle closed")
            return
        time.sleep(0.25)
    pytest.fail("the sandbox outlived its heartbeat timeout after the handle closed")
