"""Model files are told apart by content, not by name and size: the request cache keys answers by model_id."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth.llm.model_files import file_fingerprint, folder_fingerprint


@pytest.mark.parametrize("where", [0, 0.5, 1.0], ids=["header", "middle layers", "last tensors"])
def test_two_files_of_one_name_and_size_differ_where_their_weights_do(where: float, tmp_path: Path) -> None:
    """Two fine-tunes of one base, one quantisation: same size, other bytes in the header (the chat template), in
    the middle layers or in the last tensors."""
    body = bytearray(b"GGUF" + bytes(8 << 20))
    a, b = tmp_path / "a" / "merged.gguf", tmp_path / "b" / "merged.gguf"
    a.parent.mkdir()
    a.write_bytes(body)
    at = min(int(len(body) * where) + 8, len(body) - 1)
    body[at] ^= 0xFF
    b.parent.mkdir()
    b.write_bytes(body)
    assert a.stat().st_size == b.stat().st_size
    assert file_fingerprint(a) != file_fingerprint(b)
    body[at] ^= 0xFF
    b.write_bytes(body)
    assert file_fingerprint(a) == file_fingerprint(b)  # same content, anywhere: the same model


def test_a_model_folder_changes_with_its_weights_or_chat_template_not_its_notes(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"w" * 100)
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "a"}')
    before = folder_fingerprint(tmp_path)
    (tmp_path / "README.md").write_text("other notes")
    assert folder_fingerprint(tmp_path) == before
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "b"}')  # another chat template
    assert folder_fingerprint(tmp_path) != before
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "a"}')
    assert folder_fingerprint(tmp_path) == before
    (tmp_path / "model.safetensors").write_bytes(b"v" * 100)  # retrained in place
    assert folder_fingerprint(tmp_path) != before


@pytest.mark.parametrize("name", ["smollm2-135m-instruct"])
def test_a_local_gguf_generator_names_its_file_content(name: str) -> None:
    from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator
    from dpsynth.llm.local_models import resolve_local_model

    path, _ = resolve_local_model(name)
    gen = LlamaCppGenerator(path, n_ctx=256, n_threads=1)
    assert gen.model_id == f"llama_cpp:{path.name}:{file_fingerprint(path)}"


def _resolve_gemma(cache: str) -> tuple[str, int]:
    """In a process of its own (spawned): resolve the packaged Gemma model with `cache` as the user cache."""
    import os

    os.environ["DPSYNTH_CACHE"] = cache
    from dpsynth.llm.local_models import resolve_local_model

    path, _ = resolve_local_model("gemma3-270m")
    return str(path), path.stat().st_size


def test_processes_building_gemma_at_once_each_get_the_whole_checked_file(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The packaged Gemma file is assembled into the user cache on first use; three processes at once on an empty
    cache (two runs, parallel tests) each get the whole file (one builds it, under a lock, into a file of its own),
    and a damaged cached file is built again, clearing what a killed build left."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(3) as pool:
        got = pool.map(_resolve_gemma, [str(tmp_path)] * 3)
    target = tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"
    assert got == [(str(target), target.stat().st_size)] * 3 and target.stat().st_size > 200e6
    assert [p.name for p in target.parent.iterdir() if "building" in p.name] == []
    target.write_bytes(b"damaged")
    (target.parent / f".{target.name}.99999.building").write_bytes(b"a build killed midway")
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path))
    from dpsynth.llm.local_models import resolve_local_model

    assert resolve_local_model("gemma3-270m")[0] == target and target.stat().st_size == got[0][1]
    assert [p.name for p in target.parent.iterdir() if "building" in p.name] == []
