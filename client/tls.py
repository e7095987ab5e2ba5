"""TLS for the clients (nodes with tls_cert_file): what `tls=` accepts, opening a TLS socket, and
TLS failures said in one line."""
from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import Union

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: the certificate is
# trusted, but made for another name than the one connected to.
_NAME_MISMATCH = (62, 64)

class TlsFileError(ValueError):
    """A TLS file that cannot be read, or is not what it must be: `field` ("ca_file",
    "cert_file" or "key_file") names it for the caller's option names, `what` is None when the
    file cannot be read, and `reason` is the one-line cause."""

    def __init__(self, field: str, path: str, reason: str, what: str | None = None) -> None:
        super().__init__(f"cannot read {path}: {reason}" if what is None else f"{path} is not {what} ({reason})")
        self.field = field
        self.path = path
        self.reason = reason
        self.what = what


@dataclass(frozen=True)
class TlsFiles:
    """TLS named by files instead of held as an SSLContext: it pickles, so it can travel to the
    process that connects (a Spark executor) and be made into a context there."""

    enabled: bool = False  # True: TLS even without a file (the system's CAs verify the node)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext | None:
        """The SSLContext these name (a CA or client certificate implies TLS); None: plain TCP.
        A file that cannot be read or loaded raises TlsFileError naming it."""
        if not (self.enabled or self.ca_file or self.cert_file):
            return None
        for field, path in (("ca_file", self.ca_file), ("cert_file", self.cert_file), ("key_file", self.key_file)):
            if path:
                _readable(field, path)
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            if not self.ca_file:
                raise
            raise TlsFileError("ca_file", self.ca_file, _reason(exc), "a PEM file of CA certificates") from None
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise TlsFileError("cert_file", self.cert_file, _reason(exc),
                                   "a PEM certificate whose key is in it or in the key file") from None
        return ctx


def _readable(field: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TlsFileError(field, path, exc.strerror or str(exc)) from None


def _reason(exc: OSError) -> str:
    return getattr(exc, "reason", None) or exc.strerror or str(exc)


def closed_before_reply(tls_on: bool) -> str:
    """Why a new connection may have been closed before any reply: a node with TLS closes a plain
    connection at once (the handshake fails on its first bytes), and a node with tls_ca_file one
    without a client certificate it trusts (TLS 1.3: after the client's side of the handshake)."""
    if tls_on:
        return ("TLS connection closed by the server before any reply (a node with tls_ca_file "
                "requires a client certificate its CA signed)")
    return "connection closed by the server before any reply (a node with TLS closes plain connections: connect with tls)"


# What the clients' `tls=` takes: see context().
TlsOption = Union[bool, TlsFiles, ssl.SSLContext, None]


def context(tls: TlsOption) -> ssl.SSLContext | None:
    """The SSLContext for option `tls`: False/None plain TCP; True verifies the node's
    certificate against the system's CAs; TlsFiles against a CA file, with a client certificate
    (TlsFileError names a file that cannot be loaded); an SSLContext is used as it is. Only an
    SSLContext does not pickle (a client made with one cannot travel to another process)."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    if isinstance(tls, TlsFiles):
        return tls.context()
    return TlsFiles(bool(tls)).context()


def pickling_refused(tls: TlsOption) -> TypeError | None:
    """Why a client made with option `tls` cannot be pickled (an SSLContext holds what it loaded,
    keys included, and cannot be rebuilt elsewhere), in one line saying what to give instead."""
    if not isinstance(tls, ssl.SSLContext):
        return None
    return TypeError("a client made with tls=<ssl.SSLContext> cannot be pickled: make it with "
                     "tls=TlsFiles(ca_file=..., cert_file=..., key_file=...) (from queue_server.client), "
                     "whose file paths travel and are loaded where it is unpickled")


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
