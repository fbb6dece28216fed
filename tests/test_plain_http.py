"""The lean client for plain-http endpoints (llm/plain_http.py): which endpoints it takes, kept-alive connections
that the server closed while idle, and error bodies."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

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
])
def test_the_lean_client_takes_plain_http_endpoints_without_a_proxy(url: str, env: dict, expected: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert transport_for(url) == expected


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
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

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
