"""Small files replaced whole (bus.util.files), on a real directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bus.util import files


def test_a_replaced_file_holds_the_new_text_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    path = tmp_path / "state"
    files.replace_atomically(path, "first\n")
    files.replace_atomically(path, "second, ünïcode\n", fsync=True)
    assert path.read_text(encoding="utf-8") == "second, ünïcode\n"
    assert os.listdir(tmp_path) == ["state"]


def test_a_failed_replace_leaves_the_old_text_and_removes_its_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state"
    files.replace_atomically(path, "kept\n")

    def refused(source: object, target: object) -> None:
        raise OSError("rename refused")

    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(OSError, match="rename refused"):
        files.replace_atomically(path, "lost\n")
    assert path.read_text() == "kept\n"
    assert os.listdir(tmp_path) == ["state"]


def test_status_json_is_one_line_with_its_keys_sorted(tmp_path: Path) -> None:
    value = {"b": {"z": 1, "a": [1, 2]}, "a": None, "c": "é"}
    path = tmp_path / "status.json"
    files.write_status_json(path, value)
    text = path.read_text()
    assert json.loads(text) == value
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.index('"a"') < text.index('"b"') < text.index('"c"')
