"""The TLS policy every connecting peer (Hand, client) applies, so both verify the Mind the same way.

- `wss://` with the system trust store, or `--ca FILE` for a private CA: chain and hostname verified.
- `--pin sha256:HEX`: the Mind's certificate (DER) must have this SHA-256. With a pin and no CA file
  the chain is not checked (a self-signed certificate is fine: the pin is the trust); with both, both.
- The pin is checked right after the TLS handshake, before our `hello`: a credential is never used
  towards a Mind that failed verification.

An exception to "protocol opens no files": the CA file is read here, once, so that the two clients
cannot drift apart in how they trust a Mind.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
from pathlib import Path

from protocol.errors import MindhandError


class TLSConfigError(MindhandError, ValueError):
    pass


def parse_pin(pin: str) -> bytes:
    algo, _, hexdigest = pin.partition(":")
    if algo.lower() != "sha256" or len(hexdigest.replace(":", "")) != 64:
        raise TLSConfigError("a pin looks like sha256:<64 hex digits> (see scripts/mkcerts)")
    try:
        return bytes.fromhex(hexdigest.replace(":", ""))
    except ValueError:
        raise TLSConfigError("the pin's digest must be hex") from None


def fingerprint(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()


def client_context(url: str, ca: str | os.PathLike[str] | None = None, pin: str | None = None) -> ssl.SSLContext | None:
    """The SSL context for connecting to `url` (None for ws://). Raises TLSConfigError."""
    if not url.startswith("wss://"):
        if ca or pin:
            raise TLSConfigError("--ca and --pin need a wss:// Mind URL")
        return None
    if pin is not None:
        parse_pin(pin)
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=os.fspath(ca))
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"cannot load CA file {ca}: {exc}") from None
    elif pin is not None:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def ca_file_problem(ca: str | os.PathLike[str] | None) -> str | None:
    """Why a failed verification is the CA file's fault, when it is: the file holds certificates
    but none of a CA (basicConstraints CA:FALSE), typically the Mind's own certificate given where
    the certificate of the CA that signed it belongs. OpenSSL then says only "unable to get local
    issuer certificate", which does not point at the file (issue 14)."""
    if ca is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cafile=os.fspath(ca))
    except (OSError, ssl.SSLError):
        return None
    stats = ctx.cert_store_stats()
    if stats.get("x509", 0) and not stats.get("x509_ca", 0):
        return (
            f"the CA file {os.fspath(ca)} holds no CA certificate, only a leaf (CA:FALSE), such as the Mind's own "
            "certificate: give the certificate of the CA that signed the Mind's (scripts/mkcerts: DIR/ca.crt, "
            "not DIR/mind.crt)"
        )
    return None


def verify_failure(exc: ssl.SSLCertVerificationError, ca: str | os.PathLike[str] | None) -> str:
    """One sentence for a certificate the Mind presented and we do not trust."""
    why = exc.verify_message or exc.reason or str(exc)
    text = f"the Mind's certificate failed verification ({why})"
    problem = ca_file_problem(ca)
    return f"{text}: {problem}" if problem else text


def check_pin(ssl_object: ssl.SSLObject | None, pin: str | None) -> None:
    """Raise TLSConfigError unless the peer certificate matches `pin` (no-op without a pin)."""
    if pin is None:
        return
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        raise TLSConfigError("the Mind presented no certificate to check the pin against")
    if not hmac.compare_digest(hashlib.sha256(der).digest(), parse_pin(pin)):
        raise TLSConfigError(f"the Mind's certificate {fingerprint(der)} does not match the pinned one")


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot load the certificate {cert} / key {key}: {exc}") from None
    return ctx
