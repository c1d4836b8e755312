"""The HTTPS transport of API sources and token endpoints: a failed handshake is permanent, not retried.

Apart from tls.py so that the connection references, which every Dagster process of the code location
resolves, do not import httpx."""

from __future__ import annotations

import ssl

import httpx

from ingestion_assets.sources.tls import TlsError, handshake_failure, ssl_cause


class VerifiedTransport(httpx.HTTPTransport):
    """An HTTPS transport whose failed handshakes (unknown CA, wrong host, certificate refused, no common
    protocol version) are permanent
    TlsErrors instead of the ConnectErrors a client retries: no retry makes a certificate valid."""

    def __init__(self, context: ssl.SSLContext, where: str, http2: bool = True) -> None:
        super().__init__(verify=context, http2=http2)
        self._where = where

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "https":
            raise TlsError(f"{self._where}: {request.url.scheme}:// is plaintext; the source's `tls` needs https://")
        try:
            return super().handle_request(request)
        except httpx.TransportError as exc:  # TLS 1.3: a refused client certificate shows on the first read
            cause = ssl_cause(exc)
            if cause is None:
                raise
            raise TlsError(handshake_failure(self._where, request.url.host, cause)) from exc
