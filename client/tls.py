"""TLS for the clients (nodes with tls_cert_file): what `tls=` accepts, opening a TLS socket, and
TLS failures said in one line."""
from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import Union

TlsOption = Union[bool, ssl.SSLContext, None]
# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: the certificate is
# trusted, but made for another name than the one connected to.
_NAME_MISMATCH = (62, 64)

@dataclass(frozen=True)
class TlsFiles:
    """TLS named by files instead of held as an SSLContext: it pickles, so it can travel to the
    process that connects (a Spark executor) and be made into a context there."""

    enabled: bool = False  # True: TLS even without a file (the system's CAs verify the node)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext | None:
        """The SSLContext these name (a CA or client certificate implies TLS); None: plain TCP."""
        return context(self.enabled or bool(self.ca_file or self.cert_file), self.ca_file,
                       self.cert_file, self.key_file)


def closed_before_reply(tls_on: bool) -> str:
    """Why a new connection may have been closed before any reply: a node with TLS closes a plain
    connection at once (the handshake fails on its first bytes), and a node with tls_ca_file one
    without a client certificate it trusts (TLS 1.3: after the client's side of the handshake)."""
    if tls_on:
        return ("TLS connection closed by the server before any reply (a node with tls_ca_file "
                "requires a client certificate its CA signed)")
    return "connection closed by the server before any reply (a node with TLS closes plain connections: connect with tls)"


def context(tls: TlsOption, ca_file: str | None = None, cert_file: str | None = None,
            key_file: str | None = None) -> ssl.SSLContext | None:
    """The SSLContext for option `tls`: False/None plain TCP; True verifies the node's
    certificate against `ca_file` or the system's CAs (cert_file, key_file: this client's
    certificate, for nodes with tls_ca_file); an SSLContext is used as it is."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    if not tls:
        return None
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def wrap(sock: socket.socket, ctx: ssl.SSLContext, host: str) -> ssl.SSLSocket:
    """Run the TLS handshake on connected `sock` (closed if it fails)."""
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def describe(exc: BaseException) -> str | None:
    """A TLS failure in one line a person can act on; None if `exc` is not one."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in _NAME_MISMATCH:
            hint = "connect with a name the certificate was made for, or make it for this one"
        else:
            hint = "give the CA with tls_ca / --tls-ca"
        return f"TLS: the node's certificate is not trusted: {exc.verify_message} ({hint})"
    if not isinstance(exc, ssl.SSLError):
        return None
    reason = exc.reason or str(exc)
    text = reason.upper()
    if "WRONG_VERSION_NUMBER" in text or "RECORD_LAYER" in text or "PACKET_LENGTH" in text:
        hint = " (the node does not speak TLS on this port: connect without tls)"
    elif "CERTIFICATE_REQUIRED" in text or "HANDSHAKE_FAILURE" in text or "UNKNOWN_CA" in text \
            or "BAD_CERTIFICATE" in text:
        hint = " (the node requires a client certificate its tls_ca_file signed)"
    else:
        hint = ""
    return f"TLS failed: {reason}{hint}"
