"""Where a Hand lets `mind forward` go (`hand.core.forwards`, `forward`'s arguments in
`hand.system.tools`): the patterns, the default loopback, and what is refused before anything
connects."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hand.core.forwards import DEFAULT_FORWARD_ALLOW, allowed, endpoint, parse_allow
from hand.system.sandbox import Sandbox
from hand.system.tools import FileCall, ForwardTarget, Refusal, StreamCall, ToolFailed, check_forward, prepare
from protocol.codes import RejectCode


def test_patterns_parse_and_refuse_what_names_no_port():
    assert parse_allow(["db*.internal:5432,10.0.*:*", "[::1]:80", "db*.internal:5432"]) == (
        "db*.internal:5432",
        "10.0.*:*",
        "[::1]:80",
    )
    for bad in ("db.internal", ":5432", "db:", "db:http"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_allow([bad])


def test_the_default_is_the_loopback_on_any_port():
    p = DEFAULT_FORWARD_ALLOW
    assert allowed(p, "127.0.0.1", 5432, ["127.0.0.1"])
    assert allowed(p, "localhost", 80, ["127.0.0.1", "::1"])
    assert allowed(p, "::1", 22, ["::1"])
    assert not allowed(p, "10.0.0.5", 5432, ["10.0.0.5"])
    assert not allowed(p, "evil.example", 80, ["127.0.0.1", "10.0.0.5"])  # every address must be allowed
    assert not allowed(p, "nowhere.example", 80, [])


def test_a_name_or_its_addresses_may_match():
    p = parse_allow(["db*.internal:5432", "10.1.*:*"])
    assert allowed(p, "db1.internal", 5432, ["192.168.1.9"])  # by name, as the operator wrote it
    assert not allowed(p, "db1.internal", 5433, ["192.168.1.9"])
    assert allowed(p, "cache", 6379, ["10.1.2.3"])  # by address
    assert endpoint("::1", 5) == "[::1]:5" and endpoint("h", 5) == "h:5"


def _prep(args: dict, tmp_path: Path, sandbox: Sandbox | None = None):
    return prepare("forward", args, tmp_path, sandbox or Sandbox())


def test_the_arguments_are_checked_before_anything_connects(tmp_path):
    for bad in ({}, {"host": "127.0.0.1"}, {"port": 5}, {"host": "h", "port": 0}, {"host": "h", "port": 65536},
                {"path": "s.sock", "host": "h", "port": 1}, {"path": "s.sock", "port": 1}, {"host": "", "port": 1}):  # fmt: skip
        with pytest.raises(Refusal) as ei:
            _prep(bad, tmp_path)
        assert ei.value.code is RejectCode.INVALID_REQUEST
    with pytest.raises(Refusal) as ei:
        _prep({"path": "../outside.sock"}, tmp_path)
    assert ei.value.code is RejectCode.PATH_OUTSIDE_ROOT
    with pytest.raises(Refusal) as ei:
        _prep({"host": "10.9.8.7", "port": 22}, tmp_path)
    assert ei.value.code is RejectCode.DENIED_BY_POLICY and "--forward-allow" in ei.value.message
    with pytest.raises(Refusal) as ei:
        _prep({"host": "10.9.8.7", "port": 22, "check": True}, tmp_path)
    assert ei.value.code is RejectCode.DENIED_BY_POLICY
    allowing = Sandbox(forward_allow=parse_allow(["10.9.*:22"]))
    assert isinstance(_prep({"host": "10.9.8.7", "port": 22}, tmp_path, allowing), StreamCall)


def test_a_check_resolves_and_judges_the_addresses(tmp_path):
    call = _prep({"host": "localhost", "port": 5432, "check": True}, tmp_path)
    assert isinstance(call, FileCall)
    value = call.call()
    assert value["to"] == "localhost:5432" and set(value["addresses"]) <= {"127.0.0.1", "::1"}
    with pytest.raises(ToolFailed, match="cannot resolve"):
        _prep({"host": "no-such-host.invalid", "port": 1, "check": True}, tmp_path).call()


def test_a_unix_socket_inside_the_root(tmp_path):
    path = tmp_path / "app.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        call = _prep({"path": "app.sock", "check": True}, tmp_path)
        assert isinstance(call, FileCall) and call.call() == {"to": "app.sock"}
        (tmp_path / "plain").write_text("x")
        with pytest.raises(ToolFailed, match="not a Unix socket"):
            _prep({"path": "plain", "check": True}, tmp_path).call()
        with pytest.raises(ToolFailed, match="No such file"):
            check_forward(ForwardTarget(None, None, tmp_path / "gone.sock", "gone.sock", DEFAULT_FORWARD_ALLOW))
    finally:
        server.close()
