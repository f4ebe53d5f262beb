"""``Sandbox.set_network`` and host entries in ``create(network=...)`` (sync and async), against a fake
gateway: the request sent (``PUT .../network``, ``timeoutSeconds``, the new ``spec.network`` as JSON), the
conversion of plain strings to ``host``/``cidr`` entries, the local refusals of what is plainly not a host
name (before any request), and the gateway's errors (a 422 with the API server's CEL message is
``InvalidRequest``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from orchard_env import Forbidden, InvalidRequest, NotFound, SandboxClient
from orchard_env import _ops

from conftest import DRIVERS, FAST, done, sandbox_of

BASE = "/v1/namespaces/ns/sandboxes/s1"
READY = {"metadata": {"name": "s1"}, "spec": {"image": "x"},
         "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
IN_FORCE = {"generation": 3, "hostRulesInForce": True, "message": None}
#: The API server's CEL message for a host with a scheme, as the gateway answers it (422 ``Invalid``).
CEL_HOST = (
    "sandbox ns/s1: Sandbox.orchard.dev \"s1\" is invalid: spec.network.allow[0]: Invalid value: \"object\": "
    "network.allow[].host must be a host name such as pypi.org, a wildcard such as *.github.com (its "
    "subdomains), or * (any host): lowercase, no scheme (https://), port, path or IP address (write an IP "
    "range as cidr)"
)


class Gateway:
    """The gateway of sandbox ``ns/s1``: answers its GET with a Ready sandbox and each ``PUT .../network``
    with the next of ``answers`` (the last one repeats), recording the requests."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers) or [httpx.Response(200, json=IN_FORCE)]
        self.calls: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == BASE:
            return httpx.Response(200, json=READY)
        self.calls.append(request)
        assert (request.method, request.url.path) == ("PUT", f"{BASE}/network"), f"{request.method} {request.url.path}"
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def sent(request: httpx.Request) -> tuple[str, str, dict[str, str], Any]:
    return request.method, request.url.path, dict(request.url.params), json.loads(request.content)


# -- the request ----------------------------------------------------------------------------------------


@DRIVERS
async def test_set_network_puts_the_new_spec_network_and_answers_the_gateways_answer(mode: str) -> None:
    gateway = Gateway()
    async with sandbox_of(mode, gateway) as sbx:
        answer = await done(sbx.set_network(allow=["pypi.org", "files.pythonhosted.org"]))
    assert answer == IN_FORCE
    [request] = gateway.calls
    assert sent(request) == (
        "PUT", f"{BASE}/network", {"timeoutSeconds": "5"},
        {"egress": "AllowList", "allow": [{"host": "pypi.org"}, {"host": "files.pythonhosted.org"}]},
    )
    assert request.headers["authorization"] == "Bearer t"
    assert request.headers["content-type"] == "application/json"


@DRIVERS
async def test_set_network_sends_deny_the_mode_and_the_wait(mode: str) -> None:
    gateway = Gateway(httpx.Response(200, json={"generation": 4, "hostRulesInForce": None, "message": None}))
    async with sandbox_of(mode, gateway) as sbx:
        deny_all = await done(sbx.set_network(egress="Deny", wait=0))
        await done(sbx.set_network(allow=["*"], deny=["huggingface.co", "*.hf.co"], wait=0.25))
        await done(sbx.set_network(egress="AllowAll", wait=600))
    assert deny_all == {"generation": 4, "hostRulesInForce": None, "message": None}
    assert [sent(c)[2:] for c in gateway.calls] == [
        ({"timeoutSeconds": "0"}, {"egress": "Deny"}),
        ({"timeoutSeconds": "0.25"}, {"egress": "AllowList", "allow": [{"host": "*"}],
                                      "deny": [{"host": "huggingface.co"}, {"host": "*.hf.co"}]}),
        ({"timeoutSeconds": "60"}, {"egress": "AllowAll"}),
    ], "a wait past the gateway's 60 s is sent as 60"


@DRIVERS
async def test_rules_not_in_force_yet_are_an_answer_not_an_error(mode: str) -> None:
    pending = {"generation": 5, "hostRulesInForce": False,
               "message": "allow[0].host: the proxy cannot resolve its rules"}
    async with sandbox_of(mode, Gateway(httpx.Response(200, json=pending))) as sbx:
        assert await done(sbx.set_network(allow=["pypi.org"])) == pending


# -- strings to entries -------------------------------------------------------------------------------


def test_plain_strings_become_host_or_cidr_entries_and_mappings_pass_as_given() -> None:
    with_ports = {"host": "*.github.com", "ports": [{"port": 443}]}
    assert _ops.network_body(
        "AllowList", ["pypi.org", "*.github.com", "*", "10.0.0.0/8", "2001:db8::/32", "10.1.2.3/32", with_ports,
                      {"cidr": "192.0.2.0/24", "ports": [{"port": 5432}]}],
        ["huggingface.co", {"host": "*.hf.co"}],
    ) == {
        "egress": "AllowList",
        "allow": [{"host": "pypi.org"}, {"host": "*.github.com"}, {"host": "*"}, {"cidr": "10.0.0.0/8"},
                  {"cidr": "2001:db8::/32"}, {"cidr": "10.1.2.3/32"}, with_ports,
                  {"cidr": "192.0.2.0/24", "ports": [{"port": 5432}]}],
        "deny": [{"host": "huggingface.co"}, {"host": "*.hf.co"}],
    }
    # An address range with host bits set is still a range: the API server decides whether it takes it.
    assert _ops.allow_rule("10.1.2.3/8") == {"cidr": "10.1.2.3/8"}
    # The server stays the authority on what the SDK does not check (case, label syntax): sent as written.
    assert _ops.allow_rule("PyPI.org") == {"host": "PyPI.org"}
    assert _ops.network_body("Deny") == {"egress": "Deny"}
    assert _ops.network_body("AllowList", ("a.org",)) == {"egress": "AllowList", "allow": [{"host": "a.org"}]}


@pytest.mark.parametrize(("host", "says"), [
    ("https://pypi.org", "has a scheme: write the host name alone ('pypi.org')"),
    ("http://user@files.pythonhosted.org:8080/simple", "has a scheme: write the host name alone ('files.pythonhosted.org')"),
    ("pypi.org/simple", "has a path: host rules name a host ('pypi.org'), never a URL path"),
    ("pypi.org:443", "has a port: write the host alone and the port apart, {'host': 'pypi.org', 'ports': [{'port': 443}]}"),
    ("10.0.0.7", "is an IP address, which host rules never match: allow it as an address range, '10.0.0.7/32'"),
    ("2001:db8::1", "allow it as an address range, '2001:db8::1/128'"),
    ("[2001:db8::1]:443", "allow it as an address range, '2001:db8::1/128'"),
    ("10.0.0.0/33", "'10.0.0.0/33' is not an address range"),
    ("", "is not a host name"),
    ("pypi .org", "is not a host name"),
])
def test_what_is_plainly_not_a_host_name_is_refused_with_what_to_write(host: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match="^network.allow") as refused:
        _ops.allow_rule(host)
    assert says in str(refused.value)
    assert refused.value.status is None, "refused locally, not by the server"


@pytest.mark.parametrize(("host", "says"), [
    ("https://huggingface.co", "has a scheme"),
    ("huggingface.co/models", "has a path"),
    ("huggingface.co:443", "has a port: write the host alone and the port apart, 'huggingface.co'"),
    ("10.0.0.7", "is an IP address, which host rules never match: leave its address range out of allow instead"),
    ("10.0.0.0/8", "is an address range: deny takes host names only"),
])
def test_deny_takes_host_names_only(host: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match="^network.deny") as refused:
        _ops.deny_rule(host)
    assert says in str(refused.value)


@DRIVERS
async def test_local_refusals_come_before_any_request(mode: str) -> None:
    gateway = Gateway()
    async with sandbox_of(mode, gateway) as sbx:
        with pytest.raises(InvalidRequest, match="has a scheme"):
            await done(sbx.set_network(allow=["pypi.org", "https://files.pythonhosted.org"]))
        with pytest.raises(InvalidRequest, match="has a path"):
            await done(sbx.set_network(allow=["*"], deny=["huggingface.co/models"]))
        with pytest.raises(TypeError, match=r"allow= takes a list of entries such as \['pypi.org'\], not str"):
            await done(sbx.set_network(allow="pypi.org"))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="a network.allow\\[\\] host is a str"):
            await done(sbx.set_network(allow=[443]))  # type: ignore[list-item]
        with pytest.raises(TypeError, match="egress is 'Deny', 'AllowAll' or 'AllowList'"):
            await done(sbx.set_network(egress=None))  # type: ignore[arg-type]
        for wait in (-1, float("nan"), float("inf"), True, "5"):
            with pytest.raises(ValueError, match="set_network\\(wait=\\) needs a number of seconds from 0"):
                await done(sbx.set_network(allow=["pypi.org"], wait=wait))  # type: ignore[arg-type]
    assert gateway.calls == []


# -- the gateway's errors -----------------------------------------------------------------------------


@DRIVERS
async def test_the_api_servers_422_is_invalid_request_with_its_cel_message_and_not_retried(mode: str) -> None:
    gateway = Gateway(httpx.Response(422, json={"code": "Invalid", "message": CEL_HOST, "retryable": False}))
    async with sandbox_of(mode, gateway) as sbx:
        with pytest.raises(InvalidRequest) as refused:
            # Upper case passes the SDK's checks; the CEL rule (lowercase labels) is the authority.
            await done(sbx.set_network(allow=["PyPI.org"]))
    assert refused.value.status == 422 and refused.value.code == "Invalid"
    assert "network.allow[].host must be a host name such as pypi.org" in refused.value.message
    assert len(gateway.calls) == 1


@DRIVERS
@pytest.mark.parametrize(("status", "code", "raised"), [
    (400, "BadRequest", InvalidRequest),
    (403, "Forbidden", Forbidden),
    (404, "NotFound", NotFound),
])
async def test_other_refusals_map_as_for_every_call(mode: str, status: int, code: str, raised: type) -> None:
    message = {
        400: "unknown member `hosts` of spec.network (it has egress, allow and deny)",
        403: "user alice cannot update sandboxes/network in namespace ns",
        404: "sandbox ns/s1 not found",
    }[status]
    gateway = Gateway(httpx.Response(status, json={"code": code, "message": message, "retryable": False}))
    async with sandbox_of(mode, gateway) as sbx:
        with pytest.raises(raised) as refused:
            await done(sbx.set_network(allow=["pypi.org"]))
    assert (refused.value.status, refused.value.code, refused.value.message) == (status, code, message)
    assert len(gateway.calls) == 1


@DRIVERS
async def test_a_retryable_conflict_is_retried_the_put_replacing_the_same_network(mode: str) -> None:
    conflict = httpx.Response(409, json={"code": "Conflict", "message": "the object has been modified", "retryable": True})
    gateway = Gateway(conflict, httpx.Response(200, json=IN_FORCE))
    async with sandbox_of(mode, gateway) as sbx:
        assert await done(sbx.set_network(allow=["pypi.org"])) == IN_FORCE
    assert [sent(c) for c in gateway.calls] == [sent(gateway.calls[0])] * 2


# -- create(network=...) ------------------------------------------------------------------------------


def test_create_takes_host_entries_the_same_way() -> None:
    body = _ops.sandbox_body("python:3.11", network={"egress": "AllowList", "allow": ["pypi.org", "10.0.0.0/8"],
                                                     "deny": ["huggingface.co"]})
    assert body["network"] == {"egress": "AllowList", "allow": [{"host": "pypi.org"}, {"cidr": "10.0.0.0/8"}],
                               "deny": [{"host": "huggingface.co"}]}
    assert _ops.sandbox_body("x", network="AllowAll")["network"] == {"egress": "AllowAll"}
    as_api = {"egress": "AllowList", "allow": [{"cidr": "10.1.0.0/16", "ports": [{"port": 443}]}]}
    assert _ops.sandbox_body("x", network=as_api)["network"] == as_api
    with pytest.raises(InvalidRequest, match="has a scheme"):
        _ops.sandbox_body("x", network={"egress": "AllowList", "allow": ["https://pypi.org"]})
    with pytest.raises(TypeError, match=r"network\['allow'\] takes a list of entries"):
        _ops.sandbox_body("x", network={"egress": "AllowList", "allow": "pypi.org"})


def test_create_sends_the_converted_entries_and_refuses_before_any_request() -> None:
    bodies: list[Any] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(201, json={"metadata": {"name": "s1"}})

    with SandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(gateway), retry=FAST) as client:
        client.create(image="x", network={"egress": "AllowList", "allow": ["pypi.org"]}, wait=False,
                      delete_on_exit=False, auto_heartbeat=False)
        with pytest.raises(InvalidRequest, match="is an IP address"):
            client.create(image="x", network={"egress": "AllowList", "allow": ["10.0.0.7"]}, wait=False)
    assert [b["network"] for b in bodies] == [{"egress": "AllowList", "allow": [{"host": "pypi.org"}]}]
