"""Local GGUF models through llama.cpp (llama-cpp-python), the default backend.

llama.cpp keeps the KV cache of the previous prompt and reuses its longest
common prefix, so requests are processed in an order that puts identical or
shared-prefix prompts next to each other; prompts put their shared part
(task description) first for the same reason.

llama.cpp runs `threads` threads per model (default: every core available to this
process). Its threads spin while they wait for each other, so two processes (or two
runs) that together ask for more threads than there are cores slow each other down
sharply: a model warns once when the machine is already busy as it loads.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationRequest, GenerationResult, ResultCallback
from dpsynth.llm.model_files import file_fingerprint
from dpsynth.llm.quiet import c_stderr_captured, verbose

GGUF_MAGIC = b"GGUF"
log = logging.getLogger(__name__)
_warned_busy = False


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset or a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def cpu_times(stat: str) -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies per CPU from /proc/stat's text (idle and iowait count as not busy)."""
    out = {}
    for line in stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(x) for x in fields]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def busy_share_of_own_cores(read_stat: Callable[[], str] = lambda: Path("/proc/stat").read_text(),
                            wait: float = 0.2) -> float | None:
    """How many of this process's cores other work keeps busy (0 to the number of cores), measured over `wait`
    seconds on the cores of its affinity; None where /proc/stat cannot be read. The machine-wide load average
    cannot say this for a process pinned to some cores (`taskset -c 0`): one busy core of two read as a busy
    machine, and a second process pinned to the same core as none."""
    try:
        before = cpu_times(read_stat())
        time.sleep(wait)
        after = cpu_times(read_stat())
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError, ValueError, IndexError):
        return None
    measured = cpus & before.keys() & after.keys()
    if not measured:
        return None
    busy = 0.0
    for cpu in measured:
        d_busy, d_total = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
        busy += d_busy / d_total if d_total > 0 else 0.0
    return busy


def warn_if_busy(threads: int) -> None:
    """Warn once per process when other work keeps this process's cores busy as a model loads: measured on its
    own cores where Linux says (`busy_share_of_own_cores`), else the 1-minute load average over all cores."""
    global _warned_busy
    if _warned_busy:
        return
    cores = available_cores()
    busy = busy_share_of_own_cores()
    if busy is not None:
        busy_now, what = busy > cores - 0.5, f"{busy:.1f} of its {cores} core(s) in use by other work"
    else:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average on this platform
            return
        total = os.cpu_count() or cores
        busy_now, what = load > total, f"1-minute load average {load:.1f} on {total} core(s)"
    if busy_now:
        _warned_busy = True
        log.warning(
            "slow generation ahead: the machine is busy (%s) as a llama.cpp model loads with %d thread(s): "
            "concurrent generation runs slow each other down (llama.cpp's threads spin while they wait when cores "
            "are oversubscribed); run one at a time, or share the cores by setting `threads:` for each local model "
            "in the config's generators (e.g. threads: %d)",
            what, threads, max(1, cores // 2),
        )


def _check_gguf(path: Path) -> None:
    """A clear error for a file that is not a GGUF model at all, before llama.cpp is even loaded."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise DpsynthError(f"model file {path} cannot be read ({err.strerror}); check its permissions") from err
    if magic != GGUF_MAGIC:
        raise DpsynthError(
            f"model file {path} is not a GGUF model (it starts with {magic!r}, not {GGUF_MAGIC!r}); give a .gguf "
            "file in llama.cpp's format (e.g. from a Hugging Face repo's GGUF files), or a known model name, or "
            "kind: transformers for a Hugging Face model"
        )


class LlamaCppGenerator:
    def __init__(
        self,
        model_path: Path,
        *,
        name: str | None = None,
        chat: bool | None = None,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        lora_path: Path | None = None,
    ) -> None:
        """`n_threads`: CPU threads for generation and prompt processing (default: the available cores).
        `lora_path`: a llama.cpp LoRA GGUF applied to the model (`dpsynth.finetune.gguf_lora`)."""
        model_path = Path(model_path)
        if not model_path.is_file():
            raise DpsynthError(f"model file {model_path} does not exist; give the path of a .gguf file")
        _check_gguf(model_path)
        try:
            from llama_cpp import Llama
        except ImportError as err:
            raise DpsynthError("llama.cpp backend needs llama-cpp-python: pip install 'dpsynth[local]'") from err
        self._path = model_path
        self._fingerprint: str | None = None  # read on first use (two MiB of the file)
        self._lora = _file_hash(lora_path) if lora_path is not None else None
        self.name = name or model_path.stem
        threads = n_threads or available_cores()
        warn_if_busy(threads)
        try:
            # verbose=False still lets some C-level lines through (e.g. "llama_kv_cache_iswa: using full-size SWA
            # cache"): fd 2 is captured while the model loads, and quoted only if loading fails.
            with c_stderr_captured() as c_lines:
                self._llm = Llama(
                    model_path=str(model_path),
                    n_ctx=n_ctx,
                    n_threads=threads,
                    n_threads_batch=threads,
                    verbose=verbose(),
                    lora_path=None if lora_path is None else str(lora_path),
                )
        except ValueError as err:  # llama.cpp's "Failed to load model from file"
            reason = next((line.strip() for line in reversed(c_lines) if "error" in line.lower()), "")
            raise DpsynthError(
                f"llama.cpp could not load the model file {model_path} ({err}{'; ' + reason if reason else ''}); "
                "it may be damaged or cut short, or of an architecture this llama-cpp-python does not know: "
                "download it again, or upgrade llama-cpp-python"
            ) from err
        has_template = bool(self._llm.metadata.get("tokenizer.chat_template"))
        self._chat = has_template if chat is None else chat
        if self._chat and not has_template:
            raise DpsynthError(f"{model_path.name} has no chat template; set chat: false for this base model")

    @property
    def model_id(self) -> str:
        """The file's name and its content's fingerprint (`model_files.py`: never the name and size alone), and
        the adapter's content hash."""
        if self._fingerprint is None:
            self._fingerprint = file_fingerprint(self._path)
        lora = f":lora:{self._lora}" if self._lora else ""
        return f"llama_cpp:{self._path.name}:{self._fingerprint}{lora}"

    @property
    def chat(self) -> bool:
        return self._chat

    def generate(
        self, requests: Sequence[GenerationRequest], on_result: ResultCallback | None = None
    ) -> list[GenerationResult]:
        results: list[GenerationResult | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: requests[i].prompt_text())
        for i in order:
            result = self._one(requests[i])
            results[i] = result
            if on_result:
                on_result(i, result)
        return [r for r in results if r is not None]

    def _one(self, request: GenerationRequest) -> GenerationResult:
        params: dict[str, Any] = dict(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=list(request.stop) or None,
            seed=request.seed,
        )
        if request.messages is not None:
            if not self._chat:
                raise DpsynthError(f"{self.name} is a base model: it takes completion prompts, not chat messages")
            # llama-cpp-python's TypedDicts of messages and answers are too strict for mypy here (role is a
            # plain str); the answers are plain dicts at run time
            out: Any = self._llm.create_chat_completion(
                messages=[{"role": role, "content": content} for role, content in request.messages],  # type: ignore[misc]
                **params,
            )
            text = out["choices"][0]["message"]["content"] or ""
        else:
            out = self._llm.create_completion(prompt=request.prompt or "", **params)
            text = out["choices"][0]["text"]
        usage = out["usage"]
        return GenerationResult(text, usage["prompt_tokens"], usage["completion_tokens"])


def _file_hash(path: Path) -> str:
    """Content hash of an adapter file: the request cache must never serve one adapter's text for another's."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
