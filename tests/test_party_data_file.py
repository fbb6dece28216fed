"""A deployed party's file errors reach the server as text (Flower sends a ClientApp's exception message): they
must name none of the file's values, while the party's own log keeps the full message as the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth.errors import DpsynthError
from dpsynth.flower_app import _load_party_file

SECRET = "my account number is 12345678 so call me back"


@pytest.mark.parametrize("content, text_column, label_column", [
    (f"text,label\n{SECRET},ham\nanother private message,spam\n", "text", "text"),  # label column = the texts
    (f"{SECRET},ham\nanother private message,spam\n", "text", "label"),  # no header: row 1 read as the columns
    (f"text,label\n{SECRET},hma\n", "text", "label"),  # a label value outside the task's
])
def test_a_party_file_error_names_none_of_its_values(tmp_path: Path, content: str, text_column: str,
                                                     label_column: str) -> None:
    path = tmp_path / "party.csv"
    path.write_text(content)
    with pytest.raises(DpsynthError) as caught:
        _load_party_file(path, text_column, label_column, ["ham", "spam"])
    sent = str(caught.value)
    assert "12345678" not in sent and "private message" not in sent and "hma" not in sent, sent
    assert "SuperNode's log" in sent and "label_column" in sent
    assert isinstance(caught.value.__cause__, DpsynthError)  # the full message, for the party's own log


def test_a_good_party_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "party.csv"
    path.write_text(f"text,label\n{SECRET},ham\nanother private message,spam\n")
    assert _load_party_file(path, "text", "label", ["ham", "spam"]).labels == ["ham", "spam"]
