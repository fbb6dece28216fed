"""Every torch path of the `device:` setting on a GPU against the same code on the CPU, in one process (issue 37).

For each path: do the two devices agree, and how long does each take (ratio CPU / device, same run)?
- embedder: the real all-MiniLM-L6-v2 (`SentenceTransformerEmbedder`: fp16 and batch 256 on a GPU, fp32 on the CPU);
  agreement = the smallest cosine between a text's two embeddings;
- votes: WASP's Top-Q votes in torch on the device against the numpy path (`wasp_votes`), at the benchmark's
  scale (M private, N candidates, 384 dimensions); agreement = the largest absolute difference;
- sampling: `TransformersGenerator` (left-padded batches); agreement = the share of identical greedy texts;
- DP-SGD: `train_adapter` (Opacus, LoRA), without noise and with it, and person-level (3 records a person);
  agreement = the relative L2 difference of the two adapters' updates without noise (with noise the draws differ
  by construction: each device has its own generator);
- DP-SGD resumed on the CPU from a checkpoint written on the device: agreement with an uninterrupted CPU run;
- DPO: `train_on_preferences`; agreement = the difference of the last epoch's mean loss.
The causal LM is a small random-weight Llama with the embedder's tokenizer: a real PLM's weights do not travel to a
lent GPU machine (no hub there). What it checks is the device plumbing and the kernels, not sample quality.

    .venv/bin/python benchmarks/device_check.py --device cuda [--embedder DIR] [--json FILE]
    .venv/bin/python benchmarks/device_check.py --device cpu --small      (the CPU against itself: a smoke run)
Exit status 1 when a path disagrees beyond its tolerance.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth.embed.sentence import DEFAULT_EMBEDDER, SentenceTransformerEmbedder, resolve_model_path
from dpsynth.finetune.dp_adam import TrainSettings, train_adapter
from dpsynth.finetune.model import adapter_vector, add_lora
from dpsynth.finetune.preference import PreferencePair, PreferenceSettings, train_on_preferences
from dpsynth.llm.base import GenerationRequest
from dpsynth.llm.transformers_backend import TransformersGenerator, load_causal_lm
from dpsynth.voting.rank_votes import wasp_votes

TOLERANCE = {"embedder": 0.995, "votes": 1e-6, "sampling": 0.9, "dp_sgd": 1e-2, "dpo": 1e-3}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def pseudo_texts(tokenizer: Any, n: int, seed: int) -> list[str]:
    """Sentences of 12-40 whole-word vocabulary entries: embedder input of realistic lengths without a corpus."""
    rng = np.random.default_rng(seed)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2]
    return [" ".join(rng.choice(words, size=int(rng.integers(12, 41)))) for _ in range(n)]


def tiny_causal_lm(tokenizer_dir: str, out: Path) -> str:
    """A 4-layer random-weight Llama (seed 0) saved with the embedder's tokenizer ([SEP] as end of text)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, model_input_names=["input_ids", "attention_mask"])
    tok.eos_token = "[SEP]"
    config = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         eos_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so greedy decoding has few near-ties
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def check_embedder(path: str, device: str, n: int) -> dict:
    cpu = SentenceTransformerEmbedder(path, device="cpu")
    texts = pseudo_texts(cpu._model.tokenizer, n, seed=1)
    cpu.encode(texts[:64])  # warm-up
    ref, t_cpu = timed(lambda: cpu.encode(texts))
    dev = SentenceTransformerEmbedder(path, device=device)
    dev.encode(texts[:64])
    got, t_dev = timed(lambda: dev.encode(texts))
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    return {"agreement": float(cos.min()), "ok": bool(cos.min() >= TOLERANCE["embedder"]),
            "texts": n, "cpu_texts_per_s": n / t_cpu, "device_texts_per_s": n / t_dev, "speedup": t_cpu / t_dev}


def check_votes(device: str, m: int, n: int, labels: int = 2, q: int = 4) -> dict:
    rng = np.random.default_rng(2)

    def unit(rows: int) -> np.ndarray:
        x = rng.normal(size=(rows, 384)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    private, synthetic = unit(m), unit(n)
    p_labels, s_labels = rng.integers(0, labels, m), rng.integers(0, labels, n)
    ref, t_cpu = timed(lambda: wasp_votes(private, p_labels, synthetic, s_labels, q))
    wasp_votes(private[:64], p_labels[:64], synthetic, s_labels, q, device=device)  # warm-up (kernels, transfer)
    got, t_dev = timed(lambda: wasp_votes(private, p_labels, synthetic, s_labels, q, device=device))
    diff = float(np.abs(ref - got).max())
    return {"agreement": diff, "ok": bool(diff <= TOLERANCE["votes"] * max(1.0, float(np.abs(ref).max()))),
            "m": m, "n": n, "cpu_s": t_cpu, "device_s": t_dev, "speedup": t_cpu / t_dev}


def check_sampling(model_dir: str, device: str, n: int, max_tokens: int) -> dict:
    requests = [GenerationRequest(prompt=f"item {i} of the list:", max_tokens=max_tokens, temperature=0.0, seed=i)
                for i in range(n)]
    cpu = TransformersGenerator(model_dir, name="tiny", batch_size=64)
    ref, t_cpu = timed(lambda: cpu.generate(requests))
    dev = TransformersGenerator(model_dir, name="tiny", batch_size=64)
    dev.to_device(device)
    dev.generate(requests[:8])
    got, t_dev = timed(lambda: dev.generate(requests))
    same = float(np.mean([a.text == b.text for a, b in zip(ref, got)]))
    chars = float(np.mean([len(r.text) for r in got]))
    return {"agreement": same, "ok": bool(same >= TOLERANCE["sampling"] and chars > 0), "requests": n, "chars": chars,
            "cpu_s": t_cpu, "device_s": t_dev, "speedup": t_cpu / t_dev}


def _adapter_model(model_dir: str) -> tuple[Any, Any]:
    model, tok = load_causal_lm(model_dir)
    torch.manual_seed(3)
    return add_lora(model, 8, 16), tok


def check_dp_sgd(model_dir: str, device: str, records: int, steps: int) -> dict:
    _, tok = load_causal_lm(model_dir)
    texts = pseudo_texts(tok, records, seed=4)
    prompts = ["text (a: first kind):\n" if i % 2 else "text (b: second kind):\n" for i in range(records)]
    persons = np.repeat(np.arange(-(-records // 3)), 3)[:records]

    def train(on: str, noise: float, groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
        model, tok = _adapter_model(model_dir)
        start = adapter_vector(model)
        settings = TrainSettings(steps=steps, sampling_rate=0.25, noise_multiplier=noise, clip_norm=1.0,
                                 learning_rate=1e-3, max_length=64, seed=5)
        trained, seconds = timed(lambda: train_adapter(model, tok, prompts, texts, settings, checkpoint_dir=None,
                                                      groups=groups, device=on))
        return start, trained, seconds

    start, ref, t_cpu = train("cpu", 0.0)
    _, got, t_dev = train(device, 0.0)
    rel = float(np.linalg.norm((ref - start) - (got - start)) / max(np.linalg.norm(ref - start), 1e-12))
    _, noisy, t_noisy = train(device, 1.0)
    _, by_person, _ = train(device, 1.0, groups=persons)
    finite = bool(np.isfinite(noisy).all() and np.isfinite(by_person).all() and not np.allclose(noisy, got))
    moved = float(np.linalg.norm(ref - start))
    return {"agreement": rel, "ok": bool(rel <= TOLERANCE["dp_sgd"] and finite and moved > 0), "records": records,
            "update_norm": moved,
            "steps": steps, "cpu_s_per_step": t_cpu / steps, "device_s_per_step": t_dev / steps,
            "device_noisy_s_per_step": t_noisy / steps, "speedup": t_cpu / t_dev}


class _Stop(Exception):
    pass


def check_resume_across_devices(model_dir: str, device: str, records: int) -> dict:
    """DP-SGD interrupted on the device after its step-2 checkpoint, resumed on the CPU: the same adapter as an
    uninterrupted CPU run (no noise), so a checkpoint written on a GPU is readable anywhere."""
    _, tok = load_causal_lm(model_dir)
    texts = pseudo_texts(tok, records, seed=9)
    prompts = ["text (a: first kind):\n"] * records
    settings = TrainSettings(steps=4, sampling_rate=0.25, noise_multiplier=0.0, clip_norm=1.0, learning_rate=1e-3,
                             max_length=64, seed=5, checkpoint_every=2)

    def stop_at_three(step: int, _: float) -> None:
        if step == 3:
            raise _Stop

    with tempfile.TemporaryDirectory() as tmp:
        model, tok = _adapter_model(model_dir)
        start = adapter_vector(model)
        whole = train_adapter(model, tok, prompts, texts, settings, checkpoint_dir=None)
        model, tok = _adapter_model(model_dir)
        try:
            train_adapter(model, tok, prompts, texts, settings, checkpoint_dir=Path(tmp), on_step=stop_at_three,
                          device=device)
        except _Stop:
            pass
        model, tok = _adapter_model(model_dir)
        resumed = train_adapter(model, tok, prompts, texts, settings, checkpoint_dir=Path(tmp))
    rel = float(np.linalg.norm((resumed - start) - (whole - start)) / max(np.linalg.norm(whole - start), 1e-12))
    return {"agreement": rel, "ok": bool(rel <= TOLERANCE["dp_sgd"] and np.linalg.norm(whole - start) > 0),
            "records": records, "speedup": 1.0}


def check_dpo(model_dir: str, device: str, pairs: int) -> dict:
    _, tok = load_causal_lm(model_dir)
    chosen, rejected = pseudo_texts(tok, pairs, seed=6), pseudo_texts(tok, pairs, seed=7)
    data = [PreferencePair(prompt="write one:", chosen=c, rejected=r) for c, r in zip(chosen, rejected)]
    settings = PreferenceSettings(learning_rate=1e-3, batch_size=8, max_length=64, seed=8)

    def train(on: str) -> tuple[dict, float]:
        model, tok = _adapter_model(model_dir)
        model.to(on)
        return timed(lambda: train_on_preferences(model, tok, data, settings))

    ref, t_cpu = train("cpu")
    got, t_dev = train(device)
    diff = abs(ref["loss"] - got["loss"])
    return {"agreement": diff, "ok": bool(diff <= TOLERANCE["dpo"]), "pairs": pairs, "cpu_s": t_cpu,
            "device_s": t_dev, "speedup": t_cpu / t_dev}


def run_checks(device: str, embedder: str, small: bool) -> dict[str, dict]:
    sizes = ({"texts": 64, "m": 100, "n": 240, "requests": 8, "tokens": 8, "records": 24, "steps": 2, "pairs": 8}
             if small else
             {"texts": 4000, "m": 1000, "n": 9600, "requests": 256, "tokens": 32, "records": 600, "steps": 20,
              "pairs": 128})
    path = resolve_model_path(embedder)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, torch.random.fork_rng(devices=[]):  # leave the caller's RNG as is
        lm = tiny_causal_lm(path, Path(tmp) / "tiny-llama")
        results["embedder"] = check_embedder(path, device, sizes["texts"])
        results["votes"] = check_votes(device, sizes["m"], sizes["n"])
        if not small:
            results["votes_large"] = check_votes(device, 4 * sizes["m"], 4 * sizes["n"])
        results["sampling"] = check_sampling(lm, device, sizes["requests"], sizes["tokens"])
        results["dp_sgd"] = check_dp_sgd(lm, device, sizes["records"], sizes["steps"])
        results["dp_sgd_resume"] = check_resume_across_devices(lm, device, sizes["records"])
        results["dpo"] = check_dpo(lm, device, sizes["pairs"])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--embedder", default=DEFAULT_EMBEDDER, help="a sentence-transformers directory")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but torch sees no CUDA GPU")
    results = run_checks(args.device, args.embedder, args.small)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device {name}; CPU threads {torch.get_num_threads()}; torch {torch.__version__}")
    print(f"{'path':<12} {'agreement':>12} {'ok':>4} {'CPU / device time':>18}  sizes")
    for key, r in results.items():
        sizes = {k: v for k, v in r.items() if k not in ("agreement", "ok", "speedup") and not k.endswith("_s")
                 and "per_s" not in k and "per_step" not in k}
        print(f"{key:<12} {r['agreement']:>12.6g} {'yes' if r['ok'] else 'NO':>4} {r['speedup']:>17.2f}x  {sizes}")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "results": results}, indent=1))
    if not all(r["ok"] for r in results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
