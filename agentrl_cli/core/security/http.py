"""The HTTP guard of a service: bearer keys checked on every request but health and metrics, and the
audit lines of the requests that matter (plain ASGI middleware, so streamed answers pass untouched).

    app.add_middleware(BearerAuth, keys=service_keys(cfg, "sandbox"), service="sandbox",
                       audit=AuditLog.from_config(cfg, "sandbox"))

`keys=None`: requests need no key (a service on loopback, or one a person chose to leave open);
audit lines are still written, with `key_id` null. A request without the key, or with a key not in
the ring, gets 401 with `WWW-Authenticate: Bearer`, and is audited whatever its endpoint.
`audited(method, path)` picks the other requests audited (default: every method that changes
something, i.e. not GET, HEAD or OPTIONS).
"""

from __future__ import annotations

import json
from typing import Callable, Iterable

from agentrl_cli.core.security.audit import AuditLog
from agentrl_cli.core.security.keys import KeyRing

OPEN_PATHS = ("/health", "/metrics")  # prefixes: /health_generate too; probes and scrapers carry no key
# The inference server's endpoints that change what it serves (SGLang's names, then vLLM's): audited as weight updates.
WEIGHT_UPDATE_PATHS = ("/update_weights_from_disk", "/update_weights_from_tensor", "/update_weights_from_distributed",
                       "/init_weights_update_group", "/destroy_weights_update_group", "/load_lora_adapter",
                       "/unload_lora_adapter", "/update_weight_version",
                       "/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update",
                       "/shutdown_weight_transfer_engine", "/collective_rpc", "/v1/load_lora_adapter",
                       "/v1/unload_lora_adapter")
READ_METHODS = ("GET", "HEAD", "OPTIONS")


def bearer_token(authorization: str | bytes | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, else None."""
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def writes(method: str, path: str) -> bool:
    return method not in READ_METHODS


def paths(prefixes: Iterable[str]) -> Callable[[str, str], bool]:
    """An `audited` rule: requests to these paths (e.g. WEIGHT_UPDATE_PATHS)."""
    chosen = tuple(prefixes)
    return lambda method, path: path in chosen


def unauthorized_body(service: str) -> dict:
    return {"error": "Unauthorized",
            "detail": f"the {service} service needs its key as `Authorization: Bearer <key>` (config {service}.api_key, "
                      f"given by AGENTRL_{service.upper()}__API_KEY_FILE or AGENTRL_{service.upper()}__API_KEY)"}


class BearerAuth:
    def __init__(self, app, *, keys: KeyRing | None, service: str, audit: AuditLog | None = None,
                 audited: Callable[[str, str], bool] = writes, open_paths: tuple[str, ...] = OPEN_PATHS,
                 body: dict | None = None) -> None:
        """`body`: the JSON of a 401 (default: `unauthorized_body(service)`; the inference server
        answers SGLang's `{"error": "Unauthorized"}`)."""
        self.app, self.keys, self.service, self.audit, self.audited = app, keys, service, audit, audited
        self.open_paths = open_paths
        self.body = json.dumps(body if body is not None else unauthorized_body(service)).encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path.startswith(self.open_paths):
            await self.app(scope, receive, send)
            return
        kid = None
        if self.keys is not None:
            headers = dict(scope.get("headers") or ())
            kid = self.keys.match(bearer_token(headers.get(b"authorization")))
            if kid is None:
                self._audit(scope, None, 401)
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                        (b"content-length", str(len(self.body)).encode())]})
                await send({"type": "http.response.body", "body": self.body})
                return
        if self.audit is None or not self.audited(method, path):
            await self.app(scope, receive, send)
            return
        status, recorded = [500], [False]

        async def send_and_note(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                recorded[0] = True  # the line is written before the client has the whole answer
                self._audit(scope, kid, status[0])
            await send(message)
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if not recorded[0]:
                self._audit(scope, kid, status[0])

    def _audit(self, scope, kid: str | None, status: int) -> None:
        if self.audit is not None:
            client = scope.get("client")
            self.audit.record(key_id=kid, method=scope["method"], endpoint=scope["path"], status=status,
                              client=client[0] if client else None)
