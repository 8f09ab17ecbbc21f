"""Replacing a small file whole: a reader sees the old text or the new one, never a mix."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any


def replace_atomically(path: Path, text: str, *, fsync: bool = False) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path`` and rename it over ``path``.

    ``fsync`` makes the new text durable before the rename (state a restart relies on);
    a failed write removes its temporary file and leaves ``path`` as it was. Through the os
    module's calls alone: on a worker thread it takes the GIL back once per system call (a
    file object's layers make more calls and hold the GIL longer between them)."""
    temporary = path.with_name(path.name + ".tmp")
    data = memoryview(text.encode("utf-8"))
    try:
        out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            while data:
                data = data[os.write(out, data) :]
            if fsync:
                os.fsync(out)
        finally:
            os.close(out)
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
