"""Clients from `http_client` share one TLS context and still verify certificates."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading

import httpx
import pytest

from agentrl_cli.core.httpclient import http_client, tls_context


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def https_server(tmp_path):
    """An HTTPS server on loopback with a self-signed certificate for 127.0.0.1; yields (url, cert path)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed to make a self-signed certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", cert
    finally:
        server.shutdown()
        server.server_close()


def test_the_context_is_built_once_and_verifies():
    assert tls_context() is tls_context()
    assert tls_context().verify_mode == ssl.CERT_REQUIRED
    assert tls_context().check_hostname


def test_a_shared_context_client_rejects_an_untrusted_certificate(https_server):
    url, _ = https_server
    with http_client(timeout=5) as client, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get(url)


def test_an_explicit_verify_is_kept(https_server):
    url, cert = https_server
    with http_client(timeout=5, verify=ssl.create_default_context(cafile=str(cert))) as client:
        assert client.get(url).json() == {"ok": True}
