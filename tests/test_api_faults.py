"""Faulty answers of an OpenAI-compatible API are retried like 429/5xx, counted, and never become samples.

A real HTTP server on loopback (http.server in a thread) answers from a script.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.cache import CachedGenerator
from dpsynth.llm.openai_backend import OpenAICompatGenerator
from dpsynth.llm.request_store import RequestCache

GOOD = {
    "id": "x", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "A fine film."}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
}
GOOD_COMPLETION = {
    "id": "y", "object": "text_completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "text": "A dull film."}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
}


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


# Each step: (name, status, extra headers, body, bytes actually sent or None for all of them).
FAULTS = [
    ("empty choices", 200, {}, _json({**GOOD, "choices": []}), None),
    ("invalid JSON", 200, {}, b"<html>upstream hiccup</html>", None),
    ("JSON cut off", 200, {}, _json(GOOD)[:40], None),
    ("truncated body", 200, {}, _json(GOOD), 30),  # Content-Length promises more than is sent
    ("missing message", 200, {}, _json({**GOOD, "choices": [{"index": 0, "finish_reason": "stop"}]}), None),
    ("500", 500, {}, b'{"error": {"message": "boom"}}', None),
    ("503", 503, {}, b'{"error": {"message": "overloaded"}}', None),
    ("429", 429, {"Retry-After": "0"}, b'{"error": {"message": "slow down"}}', None),
]


class _Scripted(BaseHTTPRequestHandler):
    script: list = []
    seen: list = []
    good: dict = GOOD

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        name, status, headers, body, sent = self.script.pop(0) if self.script else ("good", 200, {}, None, None)
        body = _json(self.good) if body is None else body
        type(self).seen.append((name, self.path))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body if sent is None else body[:sent])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    _Scripted.script, _Scripted.seen, _Scripted.good = [], [], GOOD
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(params=["auto", "sdk"])
def transport(request: pytest.FixtureRequest) -> str:
    """Both ways a request is sent: the lean client (auto, for a plain-http endpoint) and the OpenAI SDK."""
    return request.param


def _generator(url: str, transport: str, **kw) -> OpenAICompatGenerator:
    return OpenAICompatGenerator("m", base_url=url, backoff=0.01, max_backoff=0.05, transport=transport, **kw)


def test_every_faulty_answer_is_retried_and_counted(server: str, transport: str, tmp_path: Path) -> None:
    _Scripted.script = list(FAULTS)
    backend = _generator(server, transport, max_retries=len(FAULTS), max_concurrency=1)
    cache = RequestCache(tmp_path / "cache.sqlite")
    gen = CachedGenerator(backend, cache)
    out = gen.generate([GenerationRequest(messages=(("user", "hi"),))])
    assert [r.text for r in out] == ["A fine film."] and out[0].prompt_tokens == 7
    assert [name for name, _ in _Scripted.seen] == [f[0] for f in FAULTS] + ["good"]
    assert backend.retries == len(FAULTS) and gen.usage.retries == len(FAULTS)
    assert gen.usage.requests == 1 and gen.usage.completion_tokens == 3
    rows = cache._db.execute("SELECT text FROM generations").fetchall()
    assert rows == [("A fine film.",)]  # no faulty answer was stored as a sample


def test_completion_requests_are_checked_too(server: str, transport: str) -> None:
    _Scripted.good = GOOD_COMPLETION
    _Scripted.script = [
        ("no text", 200, {}, _json({**GOOD_COMPLETION, "choices": [{"index": 0}]}), None),
        ("empty choices", 200, {}, _json({**GOOD_COMPLETION, "choices": []}), None),
    ]
    gen = _generator(server, transport, max_retries=2)
    out = gen.generate([GenerationRequest(prompt="Review:")])
    assert out[0].text == "A dull film." and gen.retries == 2
    assert {path for _, path in _Scripted.seen} == {"/v1/completions"}


def test_gives_up_on_malformed_answers_with_a_clear_error(server: str, transport: str) -> None:
    _Scripted.script = [("empty choices", 200, {}, _json({**GOOD, "choices": []}), None)] * 10
    gen = _generator(server, transport, max_retries=2)
    with pytest.raises(DpsynthError, match=r"malformed answer after 2 retries \(answer has no choices\)"):
        gen.generate([GenerationRequest(messages=(("user", "hi"),))])
    assert len(_Scripted.seen) == 3 and gen.retries == 2


def test_retry_after_is_honoured(server: str, transport: str) -> None:
    _Scripted.script = [("429", 429, {"Retry-After": "1"}, b'{"error": {"message": "slow down"}}', None)]
    gen = _generator(server, transport, max_retries=1)
    start = time.monotonic()
    assert gen.generate([GenerationRequest(messages=(("user", "hi"),))])[0].text == "A fine film."
    assert time.monotonic() - start >= 0.9  # the backoff alone would wait 10 ms
    assert gen.retries == 1


def test_client_errors_are_not_retried(server: str, transport: str) -> None:
    _Scripted.script = [("400", 400, {}, b'{"error": {"message": "max_tokens too large"}}', None)]
    gen = _generator(server, transport, max_retries=3)
    with pytest.raises(DpsynthError, match=r"rejected with HTTP 400 \(max_tokens too large\)"):
        gen.generate([GenerationRequest(messages=(("user", "hi"),))])
    assert len(_Scripted.seen) == 1 and gen.retries == 0


def test_concurrent_requests_survive_faults(server: str, transport: str) -> None:
    _Scripted.script = list(FAULTS)
    gen = _generator(server, transport, max_retries=len(FAULTS), max_concurrency=4)
    out = gen.generate([GenerationRequest(messages=(("user", f"hi {i}"),)) for i in range(6)])
    assert [r.text for r in out] == ["A fine film."] * 6
    assert gen.retries == len(FAULTS)


@pytest.mark.parametrize(("status", "message"), [(401, "API key rejected"), (404, "model or endpoint not found"),
                                                 (403, r"rejected with HTTP 403 \(not for you\)")])
def test_refusals_are_explained_in_one_line_without_retrying(server: str, transport: str, status: int,
                                                              message: str) -> None:
    _Scripted.script = [(str(status), status, {}, b'{"error": {"message": "not for you"}}', None)]
    gen = _generator(server, transport, max_retries=3)
    with pytest.raises(DpsynthError, match=message):
        gen.generate([GenerationRequest(messages=(("user", "hi"),))])
    assert len(_Scripted.seen) == 1 and gen.retries == 0


def test_an_unreachable_endpoint_is_retried_then_explained(transport: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    gen = _generator(url, transport, max_retries=2)
    with pytest.raises(DpsynthError, match="unreachable after retries"):
        gen.generate([GenerationRequest(messages=(("user", "hi"),))])
    assert gen.retries == 2
