"""Automatic heartbeats keep an open handle's sandbox alive past its heartbeat timeout; once the handle
stops beating, the sandbox expires (local cluster, real operator)."""

from __future__ import annotations

import time

import pytest

from orchard_env import InvalidRequest, NotFound, SandboxClient

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


def test_set_timeout_extends_and_shortens_a_ready_sandbox_within_the_maximum(client: SandboxClient, cluster: Cluster) -> None:
    with client.create(image=cluster.image, ttl_seconds=600, delete_on_exit=False, auto_heartbeat=False) as sbx:
        for bad in (0, -1, float("nan"), "10"):
            with pytest.raises(ValueError):
                sbx.set_timeout(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest) as beyond:
            sbx.set_timeout(10**7)
        assert beyond.value.code == "TtlBeyondMaximum" and "sandboxDefaults.maxTtlSeconds" in str(beyond.value)
        longer = sbx.set_timeout(3000)
        assert 3000 <= longer["ttlSeconds"] <= 3000 + 120 and longer["maxTtlSeconds"] >= longer["ttlSeconds"]
        # Reads come from a gateway replica's watch cache: the new TTL shows once the watch delivered it.
        seen_by = time.monotonic() + 10
        while client.get(sbx.name)["spec"]["lifecycle"]["ttlSeconds"] != longer["ttlSeconds"]:
            assert time.monotonic() < seen_by, "the new TTL never showed in the Sandbox"
            time.sleep(0.1)
        asked = time.monotonic()
        shorter = sbx.set_timeout(3)
        assert shorter["ttlSeconds"] < longer["ttlSeconds"]
    # The sandbox ends about 3 s after the call: its TTL, not its heartbeat (none), ends it.
    while time.monotonic() - asked < 3 + 20:
        try:
            status = client.get(sbx.name).get("status") or {}
        except NotFound:
            took = time.monotonic() - asked
            assert took >= 2.5, f"gone {took:.1f}s after set_timeout(3)"
            print(f"set_timeout(3): gone {took:.1f}s after the call")
            return
        assert status.get("phase") in ("Ready", "Expired", "Terminating"), status
        time.sleep(0.25)
    pytest.fail("the sandbox outlived the timeout it was set")

