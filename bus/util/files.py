"""Replacing a small file whole: a reader sees the old text or the new one, never a mix."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any


def replace_atomically(path: Path, text: str, *, fsync: bool = False) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``.

    ``fsync`` makes the new text durable before the rename (state a restart relies on);
    a failed write removes its temporary file and leaves ``path`` as it was."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "w") as out:
            out.write(text)
            if fsync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a half-written file only takes space
        raise


def status_json_text(value: Any) -> str:
    """``value`` as ``status.json`` holds it: keys sorted, on one line. Not indented: with
    ``indent`` the json module encodes in Python, several times slower than its C encoder,
    and a service writes its status every few tenths of a second on its reactor."""
    return json.dumps(value, sort_keys=True) + "\n"


def write_status_json(path: Path, value: Any) -> None:
    """A service's ``status.json`` (:func:`status_json_text`), replaced atomically."""
    write_status_text(path, status_json_text(value))


def write_status_text(path: Path, text: str) -> None:
    """Replace ``status.json`` with ``text`` atomically.

    On a full disk (no room for the temporary file) the existing file is rewritten in
    place instead, which needs no new blocks while the text is not longer: the status is
    most wanted exactly then, and a reader may at worst see a torn file once."""
    try:
        replace_atomically(path, text)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT) or not path.exists():
            raise
        with open(path, "r+") as out:
            out.write(text)
            out.truncate()
