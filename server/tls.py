"""TLS on the client TCP port (config tls_cert_file, tls_key_file, tls_ca_file): the acceptor's
SSLContext, made once at start (the supervisor's preflight makes it too, so that a bad file
stops the start in one line naming its key)."""
from __future__ import annotations

import ssl

from queue_server.config.loader import NodeConfig

# Seconds a TLS client may take to finish its handshake; a client that sends nothing (or plain
# JSON: the handshake then fails at once) is closed.
HANDSHAKE_TIMEOUT = 10.0


class TlsConfigError(ValueError):
    """A TLS file of the config cannot be used; the message names the key."""


def server_context(config: NodeConfig) -> ssl.SSLContext | None:
    """The client port's SSLContext (TLS 1.2 or later; with tls_ca_file, client certificates
    signed by those CAs are required), or None for plain TCP."""
    if not config.tls_cert_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"config key 'tls_cert_file'/'tls_key_file': cannot load {config.tls_cert_file} "
                             f"with {config.tls_key_file}: {_why(exc)}") from None
    if config.tls_ca_file:
        try:
            ctx.load_verify_locations(cafile=config.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"config key 'tls_ca_file': cannot load {config.tls_ca_file}: {_why(exc)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _why(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return getattr(exc, "strerror", None) or str(exc)
