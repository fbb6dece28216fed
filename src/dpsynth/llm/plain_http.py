"""A lean HTTP/1.1 client for OpenAI-compatible endpoints served over plain http (a vLLM or llama.cpp server on
this machine or the local network), on the standard library's `http.client`.

Why: an API generator's requests are sent by one process (or a few: `processes:`), whose CPU a request sets how
many it can ask a second and how long a round of requests takes to go out. The OpenAI SDK's generic `post` costs
1.1-1.6 ms of CPU a request on this project's 2-core test machine (its request options, headers and httpx's
transport layers), `http.client` on a kept-alive connection 0.3-0.45 ms (0.27x in one run with 64 threads:
docs/scale.md, benchmarks/openai_client_cost.py). Where the endpoint is a local server, that CPU, not the
network, is the client's share of every round.

What it does not do, so that the SDK still does it (`transport_for`): TLS (https endpoints: certificate stores,
verification), proxies (HTTP_PROXY / ALL_PROXY unless NO_PROXY names the host, and the system's settings on macOS
and Windows), credentials in the URL, redirects and compression. Errors come as `HttpStatusError` and
`HttpConnectionError`, the two kinds the generator's retry rules know; the SDK's own errors are turned into the
same two (`openai_backend`), so both transports retry, explain and count alike.
"""

from __future__ import annotations

import http.client
import json
import select
import urllib.parse
import urllib.request
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

from dpsynth import __version__


class HttpStatusError(Exception):
    """The endpoint answered with an HTTP status outside 2xx. `headers`: looked up by lower-case names (the retry
    rules read retry-after, retry-after-ms, x-should-retry); `detail`: the error message of its body when it has
    one (OpenAI's `{"error": {"message": ...}}`), else the body's first characters."""

    def __init__(self, status_code: int, headers: Mapping[str, str], detail: str) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code, self.headers, self.detail = status_code, headers, detail


class HttpConnectionError(Exception):
    """No complete answer: the connection could not be made, timed out, or closed before the whole body came."""


def error_detail(body: bytes) -> str:
    """The message of an error answer's body: OpenAI's `error.message` (or a top-level `message`), else its text."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    if isinstance(data, dict):
        error = data.get("error")
        for holder in (error, data):
            if isinstance(holder, dict) and isinstance(holder.get("message"), str):
                return str(holder["message"])
        if isinstance(error, str):
            return error
    return body[:200].decode("utf-8", "replace")


def transport_for(base_url: str) -> str:
    """'plain' where this module reaches the endpoint as the SDK would (http, no credentials or query in the URL,
    no proxy for its host: the environment's HTTP_PROXY / ALL_PROXY and NO_PROXY, and on macOS and Windows the
    system's settings, which `urllib.request.getproxies` reads as httpx does), else 'sdk'."""
    parts = urllib.parse.urlsplit(base_url)
    if (parts.scheme != "http" or not parts.hostname or parts.username is not None or parts.password is not None
            or parts.query or parts.fragment or not base_url.isascii() or any(c.isspace() for c in base_url)):
        return "sdk"
    proxies = urllib.request.getproxies()
    bypass = urllib.request.proxy_bypass  # type: ignore[attr-defined]  # public, not in typeshed
    if (proxies.get("http") or proxies.get("all")) and not bypass(parts.hostname):
        return "sdk"
    return "plain"


class PlainHttpClient:
    """JSON POSTs to one http endpoint over kept-alive connections, shared by the threads that send (a pool: a
    request takes the idle connection used last, or opens one, and gives it back once its answer is read; so at
    most as many as requests in flight). A connection the server closed while idle (uvicorn, in front of vLLM,
    closes them after 5 s, and a run's iterations are further apart than that) is noticed before it is used, as
    httpcore does, and dropped, so that it costs neither a failed request nor a backoff."""

    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http URL: {base_url}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                         "Accept": "application/json", "User-Agent": f"dpsynth/{__version__}"}
        self._idle: deque[http.client.HTTPConnection] = deque()  # append and pop are atomic: no lock
        weakref.finalize(self, _close_all, self._idle)

    def post(self, path: str, body: dict[str, Any]) -> bytes:
        """The body of a 2xx answer to a JSON POST of `body` at `path` (after the base URL's path)."""
        data = json.dumps(body).encode()
        connection = self._connection()
        try:
            connection.request("POST", self._prefix + path, body=data, headers=self._headers)
            response = connection.getresponse()
            content = response.read()
        except (OSError, http.client.HTTPException) as err:  # timeouts, resets, a body cut short
            connection.close()
            raise HttpConnectionError(f"{type(err).__name__}: {err}") from err
        except BaseException:  # an interrupt halfway: the connection's state is unknown, so it is not reused
            connection.close()
            raise
        if response.will_close:
            connection.close()
        else:
            self._idle.append(connection)
        if not 200 <= response.status < 300:
            headers = {name.lower(): value for name, value in response.headers.items()}
            raise HttpStatusError(response.status, headers, error_detail(content))
        return content

    def _connection(self) -> http.client.HTTPConnection:
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            if connection.sock is not None and not _closed_by_peer(connection.sock):
                return connection
            connection.close()


def _close_all(connections: deque[http.client.HTTPConnection]) -> None:
    while connections:
        connections.pop().close()


def _closed_by_peer(sock: Any) -> bool:
    """Whether an idle kept-alive socket has anything to read: between answers that can only be the server's
    close (or data it should not have sent), either way the connection cannot carry a request. `poll` where there
    is one (a process with many sockets may hold descriptors past `select`'s limit of 1024), `select` on Windows."""
    if not hasattr(select, "poll"):
        return bool(select.select([sock], [], [], 0)[0])
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
