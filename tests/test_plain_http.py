"""The lean client for plain-http endpoints (llm/plain_http.py): which endpoints it takes, kept-alive connections
that the server closed while idle, and error bodies."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.openai_backend import OpenAICompatGenerator
from dpsynth.llm.plain_http import error_detail, transport_for

ANSWER = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "A fine film."}}],
                     "usage": {"prompt_tokens": 2, "completion_tokens": 3}}).encode()


@pytest.mark.parametrize(("url", "env", "expected"), [
    ("http://127.0.0.1:8000/v1", {}, "plain"),
    ("http://vllm.lan:8000/v1", {}, "plain"),
    ("https://api.openai.com/v1", {}, "sdk"),  # TLS: the SDK's
    ("http://vllm.lan:8000/v1", {"HTTP_PROXY": "http://proxy:3128"}, "sdk"),  # a proxy applies: the SDK's
    ("http://vllm.lan:8000/v1", {"http_proxy": "http://proxy:3128"}, "sdk"),
    ("http://vllm.lan:8000/v1", {"ALL_PROXY": "http://proxy:3128"}, "sdk"),
    ("http://vllm.lan:8000/v1", {"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "vllm.lan"}, "plain"),
    ("http://vllm.lan:8000/v1", {"HTTPS_PROXY": "http://proxy:3128"}, "plain"),  # not for http
    ("http://vllm.lan:8000/v1", {"all_proxy": "http://proxy:3128"}, "sdk"),
    ("http://vllm.lan:8000/v1", {"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "*"}, "plain"),
    ("http://[::1]:8000/v1", {}, "plain"),
    ("http://127.0.0.1:8000", {}, "plain"),  # no path
    ("http://user:secret@vllm.lan:8000/v1", {}, "sdk"),  # basic auth: httpx sends it, the lean client would not
    ("http://vllm.lan:8000/v1?api-version=1", {}, "sdk"),
    ("http://vllm.lan:8000/my models/v1", {}, "sdk"),  # not a URL the lean client can send as it is
])
def test_the_lean_client_takes_plain_http_endpoints_without_a_proxy(url: str, env: dict, expected: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert transport_for(url) == expected


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict | None = None) -> None:
    """A JSON answer with its length (the connection stays usable for the next request)."""
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _ClosesIdleConnections(BaseHTTPRequestHandler):
    """Keeps a connection alive between requests, but closes it after 0.1 s idle (as uvicorn, in front of vLLM,
    does after 5 s); counts the connections it accepted."""

    protocol_version = "HTTP/1.1"
    timeout = 0.1
    connections = 0

    def setup(self) -> None:
        type(self).connections += 1
        super().setup()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        _reply(self, 200, ANSWER)

    def log_message(self, *args) -> None:
        pass


def test_a_connection_the_server_closed_while_idle_is_replaced_without_a_retry() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ClosesIdleConnections)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        gen = OpenAICompatGenerator("m", base_url=f"http://127.0.0.1:{server.server_port}/v1", max_concurrency=1)
        request = GenerationRequest(messages=(("user", "hi"),))
        assert gen.generate([request, request])[1].text == "A fine film."
        assert gen.generate([request])[0].text == "A fine film."
        assert _ClosesIdleConnections.connections == 1  # kept alive between the requests, and between the calls
        time.sleep(0.4)  # the server closes it meanwhile
        assert gen.generate([request])[0].text == "A fine film."
        assert gen.retries == 0 and _ClosesIdleConnections.connections == 2
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("body", "detail"), [
    (b'{"error": {"message": "max_tokens too large", "type": "invalid_request_error"}}', "max_tokens too large"),
    (b'{"message": "no such model"}', "no such model"),  # some servers put it at the top
    (b'{"error": "overloaded"}', "overloaded"),
    (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
])
def test_an_error_answer_s_message_is_what_the_user_reads(body: bytes, detail: str) -> None:
    assert error_detail(body) == detail


class _KeepAlive(BaseHTTPRequestHandler):
    """HTTP/1.1, kept alive: answers from `script` (status, extra headers, seconds to wait first) then 200s;
    `drop_after_read`: close the connection after reading the next request, without an answer (a server that
    restarts). Counts the connections and the requests."""

    protocol_version = "HTTP/1.1"
    script: list[tuple[int, dict, float]] = []
    drop_after_read = False
    connections = 0
    requests = 0
    lock = threading.Lock()

    def setup(self) -> None:
        with _KeepAlive.lock:
            _KeepAlive.connections += 1
        super().setup()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        with _KeepAlive.lock:
            _KeepAlive.requests += 1
            status, headers, wait = _KeepAlive.script.pop(0) if _KeepAlive.script else (200, {}, 0.0)
            drop, _KeepAlive.drop_after_read = _KeepAlive.drop_after_read, False
        if drop:
            self.close_connection = True
            return
        time.sleep(wait)
        _reply(self, status, ANSWER if status == 200 else b'{"error": {"message": "scripted"}}', headers)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def _keep_alive_server(script: list | None = None) -> Iterator[str]:
    _KeepAlive.script, _KeepAlive.drop_after_read = list(script or []), False
    _KeepAlive.connections = _KeepAlive.requests = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


HI = GenerationRequest(messages=(("user", "hi"),))


def _gen(url: str, transport: str = "auto", **kw) -> OpenAICompatGenerator:
    return OpenAICompatGenerator("m", base_url=url, transport=transport, backoff=0.01, max_backoff=0.02, **kw)


def test_an_error_answer_leaves_the_connection_usable_for_the_retry() -> None:
    with _keep_alive_server([(500, {}, 0.0)]) as url:
        gen = _gen(url, max_concurrency=1)
        assert gen.generate([HI])[0].text == "A fine film."
        assert gen.retries == 1 and _KeepAlive.requests == 2 and _KeepAlive.connections == 1


def test_a_server_that_drops_a_kept_alive_connection_mid_request_costs_one_retry() -> None:
    with _keep_alive_server() as url:
        gen = _gen(url, max_concurrency=1)
        gen.generate([HI])
        _KeepAlive.drop_after_read = True
        assert gen.generate([HI])[0].text == "A fine film."
        assert gen.retries == 1 and _KeepAlive.connections == 2


@pytest.mark.parametrize("transport", ["auto", "sdk"])
def test_a_read_timeout_is_retried_then_explained(transport: str) -> None:
    with _keep_alive_server([(200, {}, 1.0)] * 3) as url:
        gen = _gen(url, transport, max_retries=2, timeout=0.2)
        with pytest.raises(DpsynthError, match="unreachable after retries"):
            gen.generate([HI])
        assert gen.retries == 2


@pytest.mark.parametrize("transport", ["auto", "sdk"])
@pytest.mark.parametrize(("script", "retries", "error"), [
    ([(500, {"x-should-retry": "false"}, 0.0)], 0, r"rejected with HTTP 500 \(scripted\)"),  # the server says no
    ([(400, {"x-should-retry": "true"}, 0.0)], 1, None),  # ... or yes
    ([(408, {}, 0.0), (409, {}, 0.0)], 2, None),
    ([(429, {"retry-after-ms": "30"}, 0.0)], 1, None),
    ([(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0)], 1, None),  # a date in the past: at once
    ([(503, {"Retry-After": "300"}, 0.0)], 0, "asks to wait 300 s"),
])
def test_the_server_s_retry_headers_are_read_alike_through_both_transports(
        transport: str, script: list, retries: int, error: str | None) -> None:
    with _keep_alive_server(script) as url:
        gen = _gen(url, transport, max_retries=3, max_concurrency=1)
        if error is None:
            assert gen.generate([HI])[0].text == "A fine film."
        else:
            with pytest.raises(DpsynthError, match=error):
                gen.generate([HI])
        assert gen.retries == retries


def test_connections_are_pooled_across_threads_and_calls() -> None:
    with _keep_alive_server([(200, {}, 0.1)] * 8) as url:
        gen = _gen(url, max_concurrency=8)
        gen.generate([GenerationRequest(messages=(("user", f"t{i}"),)) for i in range(8)])
        assert _KeepAlive.connections == 8
        gen.generate([GenerationRequest(messages=(("user", f"u{i}"),)) for i in range(16)])
        assert _KeepAlive.connections == 8 and _KeepAlive.requests == 24


def test_without_poll_an_idle_connection_is_checked_with_select(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows has no select.poll."""
    monkeypatch.delattr(select, "poll")
    with _keep_alive_server() as url:
        gen = _gen(url, max_concurrency=1)
        assert [r.text for r in gen.generate([HI, HI, HI])] == ["A fine film."] * 3
        assert gen.retries == 0 and _KeepAlive.connections == 1


def test_a_key_with_a_line_break_is_refused_without_showing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_TEST_KEY", "sk-secret-123\n")
    with pytest.raises(DpsynthError, match="DPSYNTH_TEST_KEY holds a line break") as caught:
        OpenAICompatGenerator("m", base_url="http://127.0.0.1:9/v1", api_key_env="DPSYNTH_TEST_KEY")
    assert "sk-secret" not in str(caught.value)


def _until(condition, ended: threading.Event, within: float = 30.0) -> bool:
    """Whether `condition()` comes true within `within` s and before the test `ended` (a thread still waiting
    when its test failed must not act in the next one)."""
    deadline = time.monotonic() + within
    while not condition():
        if ended.is_set() or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return not ended.is_set()


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("ctrl_c_raises")
def test_an_interrupt_still_hands_the_answers_in_flight_to_the_cache() -> None:
    """A generator asked from the main thread (a run's one API generator under a spend cap) and interrupted
    (Ctrl-C: SIGINT) while four requests are in flight: nothing more is sent, and the four answers, paid for,
    still reach `on_result` before the interrupt is raised."""
    with _keep_alive_server([(200, {}, 0.5)] * 4) as url:
        gen = _gen(url, max_concurrency=4)
        heard: list[int] = []
        ended = threading.Event()
        threading.Thread(target=lambda: _until(lambda: _KeepAlive.requests >= 4, ended)
                         and os.kill(os.getpid(), signal.SIGINT), daemon=True).start()  # on the fourth's arrival
        try:
            with pytest.raises(KeyboardInterrupt):
                gen.generate([GenerationRequest(messages=(("user", f"t{i}"),)) for i in range(20)],
                             on_result=lambda i, result: heard.append(i))
        finally:
            ended.set()
        assert _KeepAlive.requests == 4 and sorted(heard) == [0, 1, 2, 3]
