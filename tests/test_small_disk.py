"""tests.small_disk's filler, on a real small tmpfs: it takes all the room even when another
process took some between its count of the free space and its write (the CI failure of the
eMQP full-disk test: the buffered write's remainder raised ENOSPC at the file's close)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import small_disk
from tests.small_disk import fill, free_bytes, small_tmpfs


def test_fill_takes_the_room_even_when_another_writer_took_some_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        real = free_bytes
        # Each count says 4 KB more than is there: another writer took it since statvfs.
        monkeypatch.setattr(small_disk, "free_bytes", lambda directory: real(directory) + 4096)
        filler = fill(disk)
        assert real(disk) == 0
        assert filler.stat().st_size > 0
        filler.unlink()
        assert real(disk) > 0
