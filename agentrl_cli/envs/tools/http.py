"""An HTTP API as a tool function (httpx, synchronous) for `ToolCaller.register`.

Belongs here: mapping HTTP outcomes onto the caller's exceptions. Not here: retries, waits and
breakers (`caller.py` does those from the exceptions raised here).

  2xx                              parsed JSON (None for an empty body)
  429                              RateLimited(Retry-After seconds, when the header is there)
  5xx                              TransientToolError
  400, 422                         InvalidToolCall (the model's arguments were bad)
  other 4xx, 3xx, non-JSON 2xx     PermanentToolError
  connect / pool timeout           TransientToolError (the request was never sent, so safe to retry)
  read / write timeout             ToolTimeout (the request may have had an effect)
  other transport errors           TransientToolError
"""

from __future__ import annotations

from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from agentrl_cli.core.httpclient import http_client
from agentrl_cli.envs.tools.caller import (InvalidToolCall, PermanentToolError, RateLimited, ToolTimeout,
                                      TransientToolError)

_BODY_METHODS = {"POST", "PUT", "PATCH"}


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
        text = str(body.get("detail", body)) if isinstance(body, dict) else str(body)
    except ValueError:
        text = response.text
    return text[:300]


class HttpTool:
    """Calls one URL with the tool arguments: a JSON body for POST/PUT/PATCH, query parameters otherwise."""

    def __init__(self, url: str, client: httpx.Client | None = None, method: str = "POST",
                 timeout_s: float | None = None) -> None:
        self.url, self.method, self.timeout_s = url, method.upper(), timeout_s
        self._own_client = client is None
        self.client = client or http_client(timeout=timeout_s if timeout_s is not None else 10.0)

    def __call__(self, arguments: dict) -> Any:
        kwargs: dict[str, Any] = {"json": arguments} if self.method in _BODY_METHODS else {"params": arguments}
        if self.timeout_s is not None:
            kwargs["timeout"] = self.timeout_s
        try:
            response = self.client.request(self.method, self.url, **kwargs)
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise TransientToolError(f"could not connect to {self.url} in time ({type(exc).__name__})") from exc
        except httpx.TimeoutException as exc:
            raise ToolTimeout(f"{self.url} did not answer in time ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise TransientToolError(f"{self.url} unreachable: {type(exc).__name__}: {exc}") from exc
        return self._result(response)

    def _result(self, response: httpx.Response) -> Any:
        code = response.status_code
        if 200 <= code < 300:
            if not response.content:
                return None
            try:
                return response.json()
            except ValueError:
                raise PermanentToolError(f"{self.url} answered {code} with a body that is not JSON") from None
        if code == 429:
            raise RateLimited(retry_after_seconds(response.headers.get("Retry-After")),
                              f"{self.url} answered 429: {_detail(response)}")
        if code >= 500:
            raise TransientToolError(f"{self.url} answered {code}: {_detail(response)}")
        if code in (400, 422):
            raise InvalidToolCall(_detail(response))
        raise PermanentToolError(f"{self.url} answered {code}: {_detail(response)}")

    def close(self) -> None:
        """Close the HTTP client if this tool created it."""
        if self._own_client:
            self.client.close()


def http_tool(url: str, client: httpx.Client | None = None, method: str = "POST", *,
              timeout_s: float | None = None) -> HttpTool:
    """A tool function for `url`. Give timeout_s (usually the ToolSpec's) so a worker the caller
    stopped waiting for is freed too; without it a client of our own times out after 10 s."""
    return HttpTool(url, client, method, timeout_s)
