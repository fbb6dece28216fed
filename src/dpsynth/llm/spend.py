"""Spend control for paid generators: caps over a run, a client-side rate limit, and the dry run's estimate.

Caps (`max_requests`, `max_total_tokens`, `max_cost` per generator) count what the run has paid for: uncached
requests and their tokens (`Usage`, carried across resumes in the checkpoints, and after a SIGKILL recovered from
the answers the request cache stores as paid by the run: `CachedGenerator.count_unrecorded_payments`). Before a
batch is sent, `SpendGuard.admit` lets through only as many requests as cannot cross a cap even if each answer is
as long as `max_tokens` allows and its prompt as long as its UTF-8 bytes (`prompt_tokens_estimate`, an upper bound
for byte-level BPE); the rest are not sent, and `SpendCapReached` stops the run. Everything paid so far is in
the request cache and the last checkpoint, so raising the cap in the run's config.yaml and resuming
continues without paying twice.

The rate limit (`requests_per_minute`, `tokens_per_minute`) paces requests as they are sent: a request
waits until the last minute's requests and tokens (prompt estimate + max_tokens) leave room for it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from dpsynth.config import GeneratorConfig
from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, Usage


class SpendCapReached(DpsynthError):
    """A generator's cap would be crossed by the next request: the run stops, keeping what it paid for."""


@dataclass(frozen=True)
class SpendLimits:
    max_requests: int | None = None
    max_total_tokens: int | None = None
    max_cost: float | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None

    @classmethod
    def of(cls, cfg: GeneratorConfig) -> SpendLimits:
        return cls(cfg.max_requests, cfg.max_total_tokens, cfg.max_cost, cfg.requests_per_minute,
                   cfg.tokens_per_minute)

    @property
    def caps(self) -> bool:
        return any(v is not None for v in (self.max_requests, self.max_total_tokens, self.max_cost))

    @property
    def paced(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


MESSAGE_OVERHEAD = 16  # tokens of chat markup per message, generously


def prompt_tokens_estimate(request: GenerationRequest) -> int:
    """An upper bound on a request's prompt tokens: its UTF-8 bytes (a byte-level BPE never makes more tokens
    than bytes, whatever the script) plus chat markup per message. English text is about 4 bytes a token, so
    caps stop early rather than late."""
    messages = len(request.messages) if request.messages is not None else 1
    return len(request.prompt_text().encode("utf-8")) + MESSAGE_OVERHEAD * messages


def worst_case(request: GenerationRequest) -> tuple[int, int]:
    """(prompt, completion) tokens a request may cost at most, as far as can be known before sending it."""
    return prompt_tokens_estimate(request), request.max_tokens


class SpendGuard:
    """Keeps one generator within its caps over the run (`admit`, called before each batch is sent)."""

    def __init__(self, name: str, limits: SpendLimits, usage: Usage, config_field: str) -> None:
        self.name = name
        self.limits = limits
        self.usage = usage
        self.config_field = config_field  # e.g. "generators[0]", for the message

    def admit(self, requests: Sequence[GenerationRequest]) -> int:
        """How many of `requests` (in order) may be sent without crossing a cap; raises SpendCapReached when
        not even the first may."""
        if not self.limits.caps or not requests:
            return len(requests)
        lim, u = self.limits, self.usage
        paid = u.requests - u.cached
        tokens = u.prompt_tokens + u.completion_tokens
        cost = u.cost or 0.0
        prices = u.prices
        admitted = 0
        for request in requests:
            p, c = worst_case(request)
            cost_next = cost + p * prices.get("prompt", 0.0) + c * prices.get("completion", 0.0)
            if ((lim.max_requests is not None and paid + 1 > lim.max_requests)
                    or (lim.max_total_tokens is not None and tokens + p + c > lim.max_total_tokens)
                    or (lim.max_cost is not None and cost_next > lim.max_cost)):
                break
            paid, tokens, cost, admitted = paid + 1, tokens + p + c, cost_next, admitted + 1
        if admitted == 0:
            raise self.reached()
        return admitted

    def reached(self) -> SpendCapReached:
        u, lim = self.usage, self.limits
        spent = (f"{u.requests - u.cached} requests, {u.prompt_tokens + u.completion_tokens} tokens"
                 + (f", cost {u.cost:.4g}" if u.cost is not None else ""))
        named = (("max_requests", lim.max_requests), ("max_total_tokens", lim.max_total_tokens),
                 ("max_cost", lim.max_cost))
        caps = ", ".join(f"{k} {v:g}" for k, v in named if v is not None)
        return SpendCapReached(f"{self.name}: the next request could cross its cap ({caps}; paid so far: {spent}); "
                               f"the run stopped and keeps everything it paid for: raise {self.config_field}'s cap "
                               "in the run directory's config.yaml and continue with `dpsynth run --resume RUN_DIR`")

class RatePacer:
    """The client-side rate limit of one API generator: `pace` is called as each request is sent (retries
    included), from the backend's worker threads."""

    def __init__(self, limits: SpendLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._window: deque[tuple[float, int]] = deque()  # (time sent, tokens) of the last minute

    def pace(self, request: GenerationRequest) -> None:
        """Wait until sending `request` keeps the last minute within the rate limits."""
        lim = self.limits
        cost = sum(worst_case(request))
        while True:
            with self._lock:
                now = time.monotonic()
                while self._window and now - self._window[0][0] >= 60.0:
                    self._window.popleft()
                count = len(self._window)
                tokens = sum(t for _, t in self._window)
                fits = ((lim.requests_per_minute is None or count + 1 <= lim.requests_per_minute)
                        and (lim.tokens_per_minute is None or tokens + cost <= lim.tokens_per_minute
                             or not self._window))
                if fits:
                    self._window.append((now, cost))
                    return
                wait = 60.0 - (now - self._window[0][0])
            time.sleep(max(wait, 0.01))
