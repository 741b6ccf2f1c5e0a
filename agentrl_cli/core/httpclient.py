"""HTTP clients (httpx, synchronous and asynchronous) that share one TLS context.

Building an `httpx.Client` with default verification loads the CA bundle into a new SSL context,
about 45 ms of CPU under the GIL; a rollout that makes one harness per slot (64 at once) stalled
for seconds on that before its first generation, and a training run that checks its servers'
weight versions at every step paid it twice per step on its event loop. An SSL context is safe to
share between clients and threads, so every client here verifies with the same one, built once
with httpx's own defaults (certifi's bundle, SSL_CERT_FILE / SSL_CERT_DIR honoured).
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process."""
    return httpx.create_ssl_context()


def http_client(**kwargs) -> httpx.Client:
    """`httpx.Client(**kwargs)` verifying TLS with the shared context unless `verify` is given."""
    kwargs.setdefault("verify", tls_context())
    return httpx.Client(**kwargs)


def async_http_client(**kwargs) -> httpx.AsyncClient:
    """`httpx.AsyncClient(**kwargs)` verifying TLS with the shared context unless `verify` is given."""
    kwargs.setdefault("verify", tls_context())
    return httpx.AsyncClient(**kwargs)
