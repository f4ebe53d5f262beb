"""Errors a trainer can act on, as exceptions (local cluster, real operator)."""

from __future__ import annotations

import time

import pytest

from orchard_env import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    NotReady,
    SandboxClient,
    SandboxStalled,
    Timeout,
    Unauthorized,
)

from conftest import Cluster


def test_not_found(client: SandboxClient) -> None:
    with pytest.raises(NotFound) as missing:
        client.get("no-such-sandbox")
    assert missing.value.status == 404 and "no-such-sandbox" in missing.value.message
    with pytest.raises(NotFound):
        client.connect("no-such-sandbox")


def test_unauthorized_and_forbidden(cluster: Cluster) -> None:
    with SandboxClient(cluster.gateway, "not-a-token", namespace=cluster.namespace) as stranger:
        with pytest.raises(Unauthorized):
            stranger.list()
    with SandboxClient(cluster.gateway, cluster.bob_token, namespace=cluster.namespace) as bob:
        with pytest.raises(Forbidden) as denied:
            bob.list()
        assert f"user bob cannot list sandboxes in namespace {cluster.namespace}" in denied.value.message
    with SandboxClient(cluster.gateway, cluster.token, namespace=cluster.other_namespace) as alice:
        with pytest.raises(Forbidden) as denied:
            alice.create(image=cluster.image)
        assert "cannot create sandboxes" in denied.value.message


def test_not_ready_conflict_invalid_and_wait_timeout(client: SandboxClient, cluster: Cluster) -> None:
    with client.create(
        image=cluster.image, name="unschedulable", node_selector={"orchard.dev/test": "nowhere"}, wait=False
    ) as stuck:
        with pytest.raises(NotReady) as early:
            stuck.exec(["true"])
        assert early.value.phase == "Pending" and early.value.retryable
        with pytest.raises(Timeout) as waited:
            stuck.wait_ready(timeout=1.5)
        assert waited.value.phase == "Pending" and "(phase Pending" in str(waited.value)
        with pytest.raises(Conflict) as taken:
            client.create(image=cluster.image, name="unschedulable", wait=False)
        assert taken.value.code == "AlreadyExists"
    with pytest.raises(InvalidRequest) as invalid:
        client.create(image=cluster.image, ttl_seconds=0)
    assert "ttlSeconds must be positive" in invalid.value.message
    with pytest.raises(InvalidRequest) as typo:
        client.create(image=cluster.image, imagee="x")
    assert "imagee" in typo.value.message


def test_a_claim_of_a_missing_pool_fails_fast_as_stalled(client: SandboxClient) -> None:
    # Needs the gateway's /wait to settle on Stalled=True (before that: a Timeout after wait_timeout).
    started = time.monotonic()
    with pytest.raises(SandboxStalled) as stalled:
        client.create(pool="no-such-pool", when_pool_empty="Wait", wait_timeout=45)
    assert stalled.value.reason == "PoolNotFound" and stalled.value.condition_message, stalled.value
    assert time.monotonic() - started < 30, f"took {time.monotonic() - started:.1f}s"
    with pytest.raises(NotFound):  # create() deleted it (delete_on_exit)
        client.get(str(stalled.value.body["metadata"]["name"]))
