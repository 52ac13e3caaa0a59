"""Credentials and the client half of the handshake (DESIGN §9).

`hello -> challenge -> proof -> welcome`. The client proves it knows the secret with an HMAC over
the full transcript (every field of `hello` and `challenge`: both nonces, role, label, version,
expiry, Mind id, handshake id, claims); the Mind proves it back in `welcome` with an HMAC over the
same transcript plus the generation it issues. The secret never crosses the wire, and a recorded
handshake cannot be replayed because each side contributes a fresh nonce.

The Mind's half lives in `mind/core/handshake.py`; both use `transcript`, `client_mac` and `mind_mac`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING, Any

import msgpack

from protocol import PROTOCOL_VERSION, limits
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError
from protocol.record import Frozen

if TYPE_CHECKING:  # the models are imported when a handshake builds one: `mind exec` never needs pydantic
    from protocol.messages import Challenge, HandClaims, Hello, Proof, Welcome

TOKEN_PREFIX = "mh1"


class Credential(Frozen):
    """Immutable (see protocol/record.py); its repr never shows the secret."""

    __slots__ = ("role", "label", "secret")
    role: str  # "hand" | "client"
    label: str
    secret: bytes

    def __init__(self, role: str, label: str, secret: bytes) -> None:
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "secret", secret)

    def token(self) -> str:
        return f"{TOKEN_PREFIX}:{self.role}:{self.label}:{self.secret.hex()}"

    def __repr__(self) -> str:  # never print the secret by accident
        return f"Credential(role={self.role!r}, label={self.label!r}, secret=<redacted>)"

    @classmethod
    def parse(cls, text: str) -> Credential:
        """Parse a token (or a credential file's content: blank lines and `#` comments ignored)."""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if len(lines) != 1:
            raise ValueError("a credential is exactly one line: mh1:ROLE:LABEL:SECRET")
        parts = lines[0].split(":")
        if len(parts) != 4 or parts[0] != TOKEN_PREFIX:
            raise ValueError("a credential looks like mh1:ROLE:LABEL:SECRET")
        _, role, label, secret_hex = parts
        if role not in ("hand", "client"):
            raise ValueError(f"credential role must be hand or client, not {role[:20]!r}")
        if not limits.LABEL_RE.match(label):
            raise ValueError("credential label must be 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)")
        try:
            secret = bytes.fromhex(secret_hex)
        except ValueError:
            raise ValueError("credential secret must be hex") from None
        if len(secret) != limits.SECRET_BYTES:
            raise ValueError(f"credential secret must be {limits.SECRET_BYTES} bytes")
        return cls(role=role, label=label, secret=secret)


def transcript(hello: Hello, challenge: Challenge, version: int = PROTOCOL_VERSION) -> bytes:
    claims = None
    if hello.claims is not None:
        claims = sorted(hello.claims.model_dump(mode="python").items())
    return msgpack.packb(
        [
            "mindhand-handshake",
            version,
            hello.role,
            hello.label,
            hello.nonce,
            claims,
            challenge.mind_id,
            challenge.handshake_id,
            challenge.nonce,
            challenge.expires_in_ms,
        ],
        use_bin_type=True,
    )


def client_mac(secret: bytes, transcript_bytes: bytes) -> bytes:
    return hmac.new(secret, b"client-proof\x00" + transcript_bytes, hashlib.sha256).digest()


def mind_mac(secret: bytes, transcript_bytes: bytes, gen: int) -> bytes:
    return hmac.new(secret, b"mind-proof\x00" + transcript_bytes + gen.to_bytes(8, "big"), hashlib.sha256).digest()


class ClientHandshake:
    """The connecting side's state machine. Pure: nonces come in, messages go out.

    The two messages it builds come from `_hello_msg` and `_proof_msg` (the pydantic models). The
    CLI's pydantic-free fast path (`mind/client/wire.py`: `Handshake`) overrides only those two, so the transcript and
    both MAC checks stay this one implementation."""

    def __init__(self, cred: Credential, nonce: bytes, claims: HandClaims | None = None) -> None:
        if len(nonce) != limits.NONCE_BYTES:
            raise ValueError("nonce has the wrong length")
        self._cred = cred
        self._hello = self._hello_msg(role=cred.role, label=cred.label, nonce=nonce, claims=claims)
        self._transcript: bytes | None = None
        self.gen: int | None = None

    @staticmethod
    def _hello_msg(**fields: Any) -> Hello:
        from protocol.messages import Hello

        return Hello(**fields)

    @staticmethod
    def _proof_msg(**fields: Any) -> Proof:
        from protocol.messages import Proof

        return Proof(**fields)

    def hello(self) -> Hello:
        return self._hello

    def on_challenge(self, ch: Challenge) -> Proof:
        if self._transcript is not None:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, "a second challenge in one handshake")
        self._transcript = transcript(self._hello, ch)
        return self._proof_msg(handshake_id=ch.handshake_id, mac=client_mac(self._cred.secret, self._transcript))

    def on_welcome(self, w: Welcome) -> int:
        if self._transcript is None:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, "welcome before challenge")
        if not hmac.compare_digest(w.mac, mind_mac(self._cred.secret, self._transcript, w.gen)):
            raise ProtocolError(
                ErrorCode.AUTH_FAILED,
                "the Mind could not prove it holds this credential (wrong Mind, or a forged welcome)",
            )
        self.gen = w.gen
        return w.gen
