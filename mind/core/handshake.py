"""The Mind's half of the handshake (DESIGN §9), as a pure state machine.

Unknown labels, revoked credentials and wrong secrets take exactly the same path: an unknown label
gets a random one-time decoy secret, so it fails at the proof check, in the same step and with the
same message as a wrong secret. Nothing tells a prober which labels exist.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import Enum

from protocol import limits
from protocol.auth import client_mac, mind_mac, transcript
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError
from protocol.messages import Challenge, HandClaims, Hello, Proof, Welcome

AUTH_FAILED_MESSAGE = "authentication failed: unknown credential or wrong secret"


class Step(Enum):
    AWAIT_HELLO = "await_hello"
    AWAIT_PROOF = "await_proof"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Identity:
    role: str
    label: str
    claims: HandClaims | None


class ServerHandshake:
    def __init__(
        self,
        mind_id: str,
        handshake_id: str,
        nonce: bytes,
        now: float,
        timeout_s: float = limits.HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self._mind_id = mind_id
        self._handshake_id = handshake_id
        self._nonce = nonce
        self._deadline = now + timeout_s
        self._timeout_ms = int(timeout_s * 1000)
        self.step = Step.AWAIT_HELLO
        self._hello: Hello | None = None
        self._secret: bytes = b""
        self._known = False
        self._transcript = b""

    def _fail(self, code: ErrorCode, message: str) -> ProtocolError:
        self.step = Step.FAILED
        return ProtocolError(code, message)

    def _check_time(self, now: float) -> None:
        if now > self._deadline:
            raise self._fail(ErrorCode.HANDSHAKE_TIMEOUT, "handshake took too long")

    def on_hello(self, hello: Hello, secret: bytes | None, decoy: bytes, now: float) -> Challenge:
        """`secret` is None when the label is unknown or revoked: continue with `decoy`."""
        if self.step is not Step.AWAIT_HELLO:
            raise self._fail(ErrorCode.UNEXPECTED_MESSAGE, "hello out of order")
        self._check_time(now)
        if hello.role == "hand" and hello.claims is None:
            raise self._fail(ErrorCode.INVALID_PAYLOAD, "a hand must send its claims in hello")
        if hello.role == "client" and hello.claims is not None:
            raise self._fail(ErrorCode.INVALID_PAYLOAD, "a client must not send hand claims")
        self._hello = hello
        self._known = secret is not None
        self._secret = secret if secret is not None else decoy
        ch = Challenge(
            mind_id=self._mind_id,
            handshake_id=self._handshake_id,
            nonce=self._nonce,
            expires_in_ms=self._timeout_ms,
        )
        self._transcript = transcript(hello, ch)
        self.step = Step.AWAIT_PROOF
        return ch

    def on_proof(self, proof: Proof, now: float) -> Identity:
        if self.step is not Step.AWAIT_PROOF or self._hello is None:
            raise self._fail(ErrorCode.UNEXPECTED_MESSAGE, "proof out of order")
        self._check_time(now)
        expected = client_mac(self._secret, self._transcript)
        # Compare first, then combine with `known` and the handshake id, so both failure kinds do the
        # same work.
        mac_ok = hmac.compare_digest(expected, proof.mac)
        id_ok = hmac.compare_digest(proof.handshake_id.encode(), self._handshake_id.encode())
        if not (mac_ok and id_ok and self._known):
            raise self._fail(ErrorCode.AUTH_FAILED, AUTH_FAILED_MESSAGE)
        self.step = Step.DONE
        return Identity(role=self._hello.role, label=self._hello.label, claims=self._hello.claims)

    def welcome(
        self,
        gen: int,
        ping_interval_s: float,
        resume_window_s: float = 0.0,
        tools: list[str] | None = None,
        run_ids: str | None = None,
    ) -> Welcome:
        if self.step is not Step.DONE:
            raise RuntimeError("welcome before a verified proof")
        return Welcome(
            gen=gen,
            mac=mind_mac(self._secret, self._transcript, gen),
            ping_interval_s=ping_interval_s,
            resume_window_s=resume_window_s,
            tools=tools,
            run_ids=run_ids,
        )
