"""Any OpenAI-compatible endpoint: OpenAI, vLLM, llama.cpp server, Ollama.

A plain-http endpoint without a proxy (a server on this machine or the local network) is asked through a lean
client on the standard library (`llm/plain_http.py`: about a quarter of the SDK's CPU a request); https
endpoints, proxies, and `transport: sdk` go through the OpenAI SDK. Requests of a batch run concurrently (a
thread pool of `max_concurrency`; with `processes` > 1, that many worker processes share it:
`llm/request_fleet.py`, for endpoints that answer faster than one process can ask).
Every faulty answer is retried with exponential backoff and jitter, up to
`max_retries` times per request: timeouts and lost connections, HTTP 408, 409,
429 and 5xx (a server's Retry-After / retry-after-ms is honoured), and
malformed answers - a body that is not JSON or is cut short, no choices, a
choice without message or text. A malformed answer never becomes a sample.
Retries are counted (`retries`, reported per generator in the run's usage).
What still fails becomes one clear error, and every result that did arrive has
already been handed to the cache. The API key is read from the environment
variable named in the config, never from a file in the project.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import queue
import random
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

from dpsynth.errors import DpsynthError, warn_user
from dpsynth.llm.base import CallStopped, GenerationRequest, GenerationResult, ResultCallback
from dpsynth.llm.plain_http import HttpConnectionError, HttpStatusError, PlainHttpClient, transport_for
from dpsynth.llm.request_fleet import RequestFleet
from dpsynth.llm.spend import RatePacer, worst_case

MAX_RETRY_AFTER = 120.0  # seconds; a server asking for a longer wait is not retried (as the openai client does)
RETRY_STATUS = frozenset({408, 409, 429})
TRANSPORTS = ("auto", "sdk")  # auto: the lean client where it can reach the endpoint (plain_http.transport_for)
# the share of a batch's wall time this process's CPU was busy above which the client, not the server, set the
# pace (all its threads count: under one interpreter lock, 0.8 of a core is near the most it gets done)
CLIENT_BOUND_SHARE = 0.8
log = logging.getLogger("dpsynth.run")


class MalformedAnswer(Exception):
    """The endpoint answered with success but not with a usable completion."""


class _CallStop:
    """Whether a call's requests should no longer be sent or retried: the call itself stopped (a request gave up,
    or its callback failed), or a request of any call in flight beside it gave up (as a `processes:` fleet stops
    every call it serves)."""

    def __init__(self, shared: threading.Event, group: threading.Event | None) -> None:
        self.own, self.shared, self.group = threading.Event(), shared, group  # group: the batch's (base.Generator)

    def is_set(self) -> bool:
        return self.own.is_set() or self.shared.is_set()


def _one_line(text: object, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The wait a server asks for: retry-after-ms, or Retry-After in seconds or as an HTTP date."""
    if not headers:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    value = headers.get("retry-after")
    if value:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return None


def parse_answer(body: bytes, *, chat: bool, unreported: tuple[int, int] | None = None) -> GenerationResult:
    """A completion from a response body, or MalformedAnswer naming what is wrong with it. `unreported`:
    the (prompt, completion) tokens to count when the server reports no usage."""
    try:
        data = json.loads(body)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        raise MalformedAnswer(f"body is not valid JSON ({_one_line(err, 80)}; {len(body)} bytes)") from err
    if not isinstance(data, dict):
        raise MalformedAnswer(f"body is a JSON {type(data).__name__}, not an object")
    if data.get("error"):
        raise MalformedAnswer(f"error in a success answer: {_one_line(data['error'])}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedAnswer("answer has no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedAnswer("choices[0] is not an object")
    if chat:
        message = choice.get("message")
        if not isinstance(message, dict):
            raise MalformedAnswer("choices[0] has no message")
        text = message.get("content")
        text = "" if text is None else text  # e.g. a refusal: an empty text, as before
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        raise MalformedAnswer(f"choices[0] has no text (got {type(text).__name__})")
    usage: dict = data["usage"] if isinstance(data.get("usage"), dict) else {}

    def count(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) and value >= 0 else None

    prompt, completion = count("prompt_tokens"), count("completion_tokens")
    if (prompt is None or completion is None) and unreported is not None:
        # a server that does not report usage is counted at the worst case, so that spend caps still hold
        return GenerationResult(text, *unreported)
    return GenerationResult(text, prompt or 0, completion or 0)


def client_bound(cpu_seconds: float, wall_seconds: float, requests: int, concurrency: int) -> bool:
    """Whether a batch was paced by the asking process's CPU: busy at least CLIENT_BOUND_SHARE of the time, over
    enough rounds of `concurrency` requests (and enough seconds) for start-up not to be what was measured."""
    return (requests >= 4 * concurrency and wall_seconds >= 2.0
            and cpu_seconds >= CLIENT_BOUND_SHARE * wall_seconds)


def _sdk_response_class() -> type:
    """What `cast_to` must name for the SDK's `post` to return the raw HTTP response: its HTTP client's Response
    class (httpx2's where the SDK runs on httpx2, as from openai 3 on, which it imports with itself; httpx's before)."""
    module = sys.modules.get("httpx2")
    if module is None:
        import httpx

        return httpx.Response
    return module.Response


class OpenAICompatGenerator:
    # its work happens on a server: a run's API generators are asked side by side (methods/generation.py)
    runs_remotely = True
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        name: str | None = None,
        chat: bool = True,
        max_concurrency: int = 4,
        max_retries: int = 5,
        timeout: float = 120.0,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        pacer: RatePacer | None = None,
        processes: int = 1,
        transport: str = "auto",
    ) -> None:
        if transport not in TRANSPORTS:
            raise DpsynthError(f"transport '{transport}': choose one of {', '.join(TRANSPORTS)}")
        key = os.environ.get(api_key_env)
        if key is None and base_url is None:
            raise DpsynthError(f"environment variable {api_key_env} is not set; export your API key there")
        if key is not None and ("\n" in key or "\r" in key):  # a header cannot carry it; never echo the key
            raise DpsynthError(f"environment variable {api_key_env} holds a line break; export the key alone")
        bearer = key or "not-needed"  # a local server takes any key; the header is sent all the same
        self._plain: PlainHttpClient | None = None
        self._client: Any = None
        if transport == "auto" and base_url is not None and transport_for(base_url) == "plain":
            self._plain = PlainHttpClient(base_url, bearer, timeout)
        else:
            try:
                import openai
            except ImportError as err:
                raise DpsynthError("the OpenAI-compatible backend needs openai: pip install 'dpsynth[openai]'") from err
            self._openai = openai
            self._raw_response = _sdk_response_class()
            # The client does not retry: this backend retries everything itself, malformed answers included,
            # so that every retry is counted and bounded by the same max_retries.
            self._client = openai.OpenAI(api_key=bearer, base_url=base_url, max_retries=0, timeout=timeout)
        self._model = model
        self._base_url = base_url or "https://api.openai.com/v1"
        self.name = name or model
        self._chat = chat
        self._max_concurrency = max_concurrency
        self._max_retries = max_retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._pacer = pacer  # client-side requests / tokens per minute, applied to every attempt
        self._count_lock = threading.Lock()
        self._client_bound_said = False
        self._said_retrying = False
        self._retries = 0  # requests sent again by this process
        # max_concurrency holds across calls: a run may ask this generator for replacements of dropped answers
        # while its main batch is still in flight (methods/generation.py)
        self._slots = threading.BoundedSemaphore(max_concurrency)
        # a request that gives up stops every call in flight with it (a run asks in several calls at once: blocks,
        # replacements), not the calls after: cleared when a call starts while none is in flight
        self._gave_up = threading.Event()
        self._first_give_up: BaseException | None = None
        self._calls_in_flight = 0
        self._pool: ThreadPoolExecutor | None = None  # `_threads`, started on first use
        if processes > 1 and pacer is not None:
            raise DpsynthError(f"generator {self.name}: client-side rate limits pace one process; set processes: 1")
        settings = dict(model=model, base_url=base_url, api_key_env=api_key_env, name=self.name, chat=chat,
                        max_retries=max_retries, timeout=timeout, backoff=backoff, max_backoff=max_backoff,
                        transport=transport)
        self._fleet = RequestFleet(settings, processes, max_concurrency, self.name) if processes > 1 else None

    @property
    def retries(self) -> int:
        """Requests sent again over this generator's life, in every process."""
        return self._retries + (self._fleet.retries if self._fleet is not None else 0)

    @property
    def sends_elsewhere(self) -> bool:
        """From request processes (`processes:` 2 or more), not this process's threads (CachedGenerator)."""
        return self._fleet is not None

    @property
    def max_concurrency(self) -> int:
        """Requests in flight at most, over every call and process."""
        return self._max_concurrency

    @property
    def model_id(self) -> str:
        return f"openai:{self._base_url}:{self._model}"

    @property
    def chat(self) -> bool:
        return self._chat

    def generate(
        self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None,
        stop: threading.Event | None = None,
    ) -> list[GenerationResult]:
        """`stop`: shared by the calls of one batch (base.Generator): set here when a request gives up; a call
        that starts once it is set sends nothing."""
        if self._fleet is not None:
            return self._fleet.generate(requests, on_result, stop)
        with self._count_lock:
            if stop is not None and stop.is_set():
                raise CallStopped
            if not self._calls_in_flight:
                self._gave_up.clear()
                self._first_give_up = None
            self._calls_in_flight += 1
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            results, error = self._send_all(requests, on_result, _CallStop(self._gave_up, stop))
        finally:
            with self._count_lock:
                self._calls_in_flight -= 1
                first_give_up = self._first_give_up  # before a call starting next clears it
        self._hint_if_client_bound(len(requests), time.process_time() - cpu, time.perf_counter() - wall)
        if isinstance(error, CallStopped):  # stopped by a request of another call: that request's error
            error = first_give_up or error
        if error is not None:
            raise self._explain(error) from error
        return [r for r in results if r is not None]

    def cancel(self) -> None:
        """Stop every call in flight (an interrupted run): requests waiting for a slot are not sent and retries
        stop; the answers in flight still come back to their calls, which then fail with "interrupted"."""
        if self._fleet is not None:
            self._fleet.cancel()
            return
        with self._count_lock:
            if self._calls_in_flight:
                self._first_give_up = self._first_give_up or DpsynthError(f"{self.name}: the run was interrupted")
                self._gave_up.set()

    def _threads(self) -> ThreadPoolExecutor:
        """The generator's sending threads, `max_concurrency` of them, started once and shared by its calls (a run
        asks in blocks and replacements, each a call: a pool of its own per call started up to 64 threads each
        time, about 4.5 ms on this project's test machine, on the way to every block's first request). Stopped
        when the generator is garbage-collected."""
        with self._count_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._max_concurrency,
                                                thread_name_prefix=f"{self.name}-requests")
                weakref.finalize(self, self._pool.shutdown, wait=False)
            return self._pool

    def _send_all(self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None,
                  stop: _CallStop) -> tuple[list[GenerationResult | None], BaseException | None]:
        """Every request from the generator's threads (`_threads`, shared with the calls beside it, which queue
        their requests in turn), each in a slot of its concurrency: the results and the first error. A request is
        handed to the threads only once an answer before it has gone to `on_result` (at most `max_concurrency`
        unheard), as the request fleet does: when the answers can no longer be kept (`on_result` fails: the
        request cache's disk is full) nothing more is paid for, however far this thread, which hears every
        answer, lags behind the sending. The first request that gives up (which stops the calls beside it too)
        or the first error of `on_result` ends the sending; the answers already in flight still come back and go
        to `on_result`, so that the request cache keeps what was paid for (its later errors are not raised)."""
        results: list[GenerationResult | None] = [None] * len(requests)
        error: BaseException | None = None
        heard_failed = False
        answered: queue.SimpleQueue = queue.SimpleQueue()
        todo = list(enumerate(requests))[::-1]
        sent: set[Future] = set()  # this call's requests not yet heard
        pool = self._threads()

        def send() -> None:
            i, request = todo.pop()
            future = pool.submit(self._one_in_slot, request, stop)
            sent.add(future)
            future.add_done_callback(lambda done: answered.put((i, done)))

        try:
            while todo and len(sent) < self._max_concurrency:
                send()
            while sent:
                i, future = answered.get()
                sent.discard(future)
                problem = future.exception()
                if problem is None:
                    result = results[i] = future.result()
                    try:
                        if on_result:
                            on_result(i, result)
                    except BaseException as err:  # noqa: BLE001 - e.g. the cache cannot keep answers
                        problem, heard_failed = (None if heard_failed else err), True
                if problem is not None:
                    error = error or problem
                    stop.own.set()
                if todo and stop.is_set():  # stopped here, or by a request of a call beside it
                    error = error or CallStopped()
                    todo.clear()
                elif todo:
                    send()
        except BaseException:  # e.g. an interrupt: nothing more is sent
            stop.own.set()
            todo.clear()
            # those still queued (perhaps behind other calls' requests) are not sent, and not waited for: a
            # cancelled future is done only once a thread reaches it; those in flight come back (no more retries)
            futures_wait([future for future in sent if not future.cancel()])
            self._hand_on_what_came_back(answered, results, on_result)
            raise
        return results, error

    @staticmethod
    def _hand_on_what_came_back(answered: queue.SimpleQueue, results: list[GenerationResult | None],
                                on_result: ResultCallback | None) -> None:
        """After an interrupt, the answers of the requests that were in flight: paid for, so to `on_result` (the
        request cache) all the same; its errors are not raised over the interrupt."""
        while True:
            try:
                i, future = answered.get_nowait()
            except queue.Empty:
                return
            if not future.cancelled() and future.exception() is None and results[i] is None:
                result = results[i] = future.result()
                if on_result:
                    try:
                        on_result(i, result)
                    except Exception:  # noqa: BLE001, S112 - the interrupt is what is raised
                        continue

    def _hint_if_client_bound(self, requests: int, cpu_seconds: float, wall_seconds: float) -> None:
        """Say once when this process's CPU, not the server, set the pace of a batch (one process asks at most
        several hundred requests a second), and how to lift it: `processes:`."""
        if self._client_bound_said or not client_bound(cpu_seconds, wall_seconds, requests, self._max_concurrency):
            return
        self._client_bound_said = True
        log.warning("%s: this process was busy %.0f%% of the %.1f s it took to ask %d requests, so its own CPU "
                    "(0.3-1.5 ms a request), not the server, set the pace; `processes: 2` or more in the generator's "
                    "config sends them from several processes (docs/scale.md)", self.name,
                    100 * cpu_seconds / wall_seconds, wall_seconds, requests)

    def _one_in_slot(self, request: GenerationRequest, stop: _CallStop) -> GenerationResult:
        with self._slots:
            if stop.is_set():  # it waited for its slot while the call stopped: not sent
                raise CallStopped
            try:
                return self._one(request, stop)
            except CallStopped:
                raise
            except Exception as err:  # it gave up: the calls in flight stop before its slot is free
                with self._count_lock:  # and, while this call is in flight, its batch's later calls too
                    self._first_give_up = self._first_give_up or err
                    self._gave_up.set()
                    if stop.group is not None:
                        stop.group.set()
                raise

    def _one(self, request: GenerationRequest, failed: Any = None) -> GenerationResult:
        """One request, retried; `failed.is_set()` (an event, here or shared with other processes) stops the
        retries."""
        attempt = 0
        while True:
            try:
                return self._attempt(request)
            except Exception as err:
                delay = self._retry_delay(err, attempt)
                if delay is None or attempt >= self._max_retries:
                    raise
                if failed is not None and failed.is_set():  # not its own failure: the one that stopped it is
                    raise CallStopped from err
                if isinstance(err, HttpConnectionError):
                    self._say_retrying(err)
            attempt += 1
            with self._count_lock:
                self._retries += 1
            time.sleep(delay)

    def _say_retrying(self, err: HttpConnectionError) -> None:
        """Once per generator, on the terminal: a server that cannot be reached, or that takes `timeout` s without
        answering, is otherwise waited for silently through every retry (minutes, at the default 120 s a try)."""
        with self._count_lock:
            if self._said_retrying:
                return
            self._said_retrying = True
        warn_user(f"{self.name}: no answer from {self._base_url} ({str(err)[:100]}); retrying with backoff "
                  f"(max_retries: {self._max_retries}): check that the server runs and answers")

    def _attempt(self, request: GenerationRequest) -> GenerationResult:
        if self._pacer is not None:
            self._pacer.pace(request)
        body: dict[str, Any] = dict(
            model=self._model,
            max_tokens=request.max_tokens,  # llama.cpp's server ignores max_completion_tokens
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
        )
        if request.stop:
            body["stop"] = list(request.stop)
        if request.messages is not None:
            path, body["messages"] = "/chat/completions", [{"role": r, "content": c} for r, c in request.messages]
        else:
            path, body["prompt"] = "/completions", request.prompt
        content = self._plain.post(path, body) if self._plain is not None else self._sdk_post(path, body)
        return parse_answer(content, chat=request.messages is not None, unreported=worst_case(request))

    def _sdk_post(self, path: str, body: dict[str, Any]) -> bytes:
        """The SDK's generic `post` (its auth, base URL, TLS, proxies and timeout) with the body as it is sent:
        the typed `create` spends about a third of the SDK's CPU a request (benchmarks/openai_client_cost.py)
        turning these plain values through its TypedDict transforms. The raw answer is parsed by the caller,
        strictly: the SDK's lenient parsing lets an empty or broken answer through as an object that fails (or
        worse, becomes an empty sample) later. Its errors become the two kinds the retry rules know."""
        o = self._openai
        try:
            response: Any = self._client.post(path, body=body, cast_to=self._raw_response)
        except o.APIStatusError as err:
            detail = (err.body.get("message") if isinstance(err.body, dict) else None) or err.message
            raise HttpStatusError(err.status_code, err.response.headers, str(detail)) from err
        except o.APIConnectionError as err:  # timeouts too
            raise HttpConnectionError(f"{type(err).__name__}: {err}") from err
        return response.content

    def _retry_delay(self, err: BaseException, attempt: int) -> float | None:
        """Seconds to wait before retrying after `err`, or None if retrying cannot help."""
        backoff = min(self._backoff * 2.0**attempt, self._max_backoff) * (1 - 0.25 * random.random())
        if isinstance(err, (MalformedAnswer, HttpConnectionError)):  # incl. timeouts and bodies cut short
            return backoff
        if isinstance(err, HttpStatusError):
            headers = err.headers
            should = headers.get("x-should-retry")
            if should == "false" or (should != "true" and err.status_code not in RETRY_STATUS
                                     and err.status_code < 500):
                return None
            wait = retry_after_seconds(headers)
            if wait is None:
                return backoff
            return wait if wait <= MAX_RETRY_AFTER else None
        return None

    def _explain(self, err: BaseException) -> BaseException:
        where = f"{self._base_url} (model {self._model})"
        if isinstance(err, MalformedAnswer):
            return DpsynthError(f"{where}: malformed answer after {self._max_retries} retries ({err}); check that "
                                "base_url is an OpenAI-compatible endpoint and that the server is healthy")
        if isinstance(err, HttpConnectionError):
            return DpsynthError(f"{where}: unreachable after retries ({_one_line(err)}); check base_url and that "
                                "the server runs")
        if isinstance(err, HttpStatusError):
            if err.status_code == 401:
                return DpsynthError(f"{where}: API key rejected; check the key in the environment")
            if err.status_code == 404:
                return DpsynthError(f"{where}: model or endpoint not found; check model and base_url")
            wait = retry_after_seconds(err.headers)
            if wait is not None and wait > MAX_RETRY_AFTER:
                return DpsynthError(f"{where}: HTTP {err.status_code}, the server asks to wait {wait:.0f} s "
                                    f"(over {MAX_RETRY_AFTER:.0f} s); try again later")
            if self._retry_delay(err, 0) is None:
                return DpsynthError(f"{where}: request rejected with HTTP {err.status_code} "
                                    f"({_one_line(err.detail)}); check the generator's settings")
            return DpsynthError(f"{where}: request failed after retries with HTTP {err.status_code}")
        return err
