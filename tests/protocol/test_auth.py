"""The handshake (DESIGN §9), both halves, as pure state machines."""

import os

import pytest

from mind.core.handshake import AUTH_FAILED_MESSAGE, ServerHandshake
from protocol.auth import ClientHandshake, Credential
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError
from protocol.messages import HandClaims, Proof, Welcome

CLAIMS = HandClaims(hostname="h", platform="linux", machine="x86_64", python="3.11", version="0.1")


def cred(role="hand", label="laptop"):
    return Credential(role=role, label=label, secret=os.urandom(32))


def run(client_cred, server_secret, claims=CLAIMS, now2=1.0):
    c = ClientHandshake(client_cred, os.urandom(32), claims)
    s = ServerHandshake("mind-1", "hs1", os.urandom(32), now=0.0)
    ch = s.on_hello(c.hello(), server_secret, os.urandom(32), now=0.1)
    proof = c.on_challenge(ch)
    ident = s.on_proof(proof, now=now2)
    w = s.welcome(7, 10.0)
    return c, s, ident, w


def test_good_credential_is_mutual():
    cr = cred()
    c, s, ident, w = run(cr, cr.secret)
    assert ident.label == "laptop" and ident.role == "hand"
    assert c.on_welcome(w) == 7


def test_secret_never_in_any_message():
    cr = cred()
    c = ClientHandshake(cr, os.urandom(32), CLAIMS)
    s = ServerHandshake("mind-1", "hs1", os.urandom(32), now=0.0)
    ch = s.on_hello(c.hello(), cr.secret, os.urandom(32), 0.0)
    proof = c.on_challenge(ch)
    s.on_proof(proof, 0.0)
    for m in (c.hello(), ch, proof, s.welcome(1, 1.0)):
        assert cr.secret not in repr(m.model_dump()).encode() and cr.secret.hex() not in repr(m.model_dump())


def test_wrong_secret_and_unknown_label_fail_identically():
    cr = cred()
    with pytest.raises(ProtocolError) as wrong:
        run(cr, os.urandom(32))
    with pytest.raises(ProtocolError) as unknown:
        run(cr, None)
    assert wrong.value.code is unknown.value.code is ErrorCode.AUTH_FAILED
    assert wrong.value.message == unknown.value.message == AUTH_FAILED_MESSAGE


def test_forged_welcome_is_refused_by_client():
    cr = cred()
    c, s, ident, w = run(cr, cr.secret)
    forged = Welcome(gen=w.gen + 1, mac=w.mac, ping_interval_s=1.0)
    with pytest.raises(ProtocolError) as ei:
        c.on_welcome(forged)
    assert ei.value.code is ErrorCode.AUTH_FAILED


def test_recorded_proof_does_not_replay_into_a_new_handshake():
    cr = cred()
    c = ClientHandshake(cr, os.urandom(32), CLAIMS)
    s1 = ServerHandshake("mind-1", "hs1", os.urandom(32), now=0.0)
    proof = c.on_challenge(s1.on_hello(c.hello(), cr.secret, os.urandom(32), 0.0))
    s2 = ServerHandshake("mind-1", "hs1", os.urandom(32), now=0.0)  # fresh server nonce
    s2.on_hello(c.hello(), cr.secret, os.urandom(32), 0.0)
    with pytest.raises(ProtocolError):
        s2.on_proof(proof, 0.0)


def test_transcript_covers_claims():
    cr = cred()
    c = ClientHandshake(cr, os.urandom(32), CLAIMS)
    s = ServerHandshake("mind-1", "hs1", os.urandom(32), now=0.0)
    # server saw different claims than the client signed
    tampered = c.hello().model_copy(update={"claims": CLAIMS.model_copy(update={"hostname": "evil"})})
    ch = s.on_hello(tampered, cr.secret, os.urandom(32), 0.0)
    with pytest.raises(ProtocolError):
        s.on_proof(c.on_challenge(ch), 0.0)


def test_handshake_deadline():
    cr = cred()
    with pytest.raises(ProtocolError) as ei:
        run(cr, cr.secret, now2=60.0)
    assert ei.value.code is ErrorCode.HANDSHAKE_TIMEOUT


def test_proof_before_hello_is_refused():
    s = ServerHandshake("mind-1", "hs1", os.urandom(32), now=0.0)
    with pytest.raises(ProtocolError):
        s.on_proof(Proof(handshake_id="hs1", mac=b"x" * 32), 0.0)


def test_credential_token_round_trip_and_redacted_repr():
    cr = cred("client", "ops")
    assert Credential.parse("# comment\n" + cr.token() + "\n") == cr
    assert cr.secret.hex() not in repr(cr)
    for bad in ("", "mh1:hand:x", "mh2:hand:x:" + "0" * 64, "mh1:root:x:" + "0" * 64, "mh1:hand:x:zz"):
        with pytest.raises(ValueError):
            Credential.parse(bad)


def test_digests_ignore_key_order_but_not_values():
    from protocol.digest import args_digest, binding_digest

    a = {"argv": ["ls"], "cwd": "x", "env": {"A": "1", "B": "2"}}
    b = {"env": {"B": "2", "A": "1"}, "cwd": "x", "argv": ["ls"]}
    assert args_digest("exec", a) == args_digest("exec", b)
    assert binding_digest("exec", a, 10) == binding_digest("exec", b, 10)
    assert binding_digest("exec", a, 10) != binding_digest("exec", a, 11)
    assert args_digest("exec", a) != args_digest("shell", a)
    assert args_digest("exec", {"argv": ["ls", "-l"]}) != args_digest("exec", {"argv": ["-l", "ls"]})
