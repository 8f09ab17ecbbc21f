"""A small filesystem a test mounts (a tmpfs), fills and frees: a real full disk."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. "8m") on ``directory`` and unmount it afterwards.
    Skips the test where mounting is not permitted (not root, no CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        if subprocess.run(["umount", str(directory)], capture_output=True).returncode != 0:
            # Still busy (a process of the test kept a file open): detach it anyway.
            subprocess.run(["umount", "-l", str(directory)], check=True)


def free_bytes(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def fill(directory: Path, leave: int = 0, name: str = "filler") -> Path:
    """Take all the free space but ``leave`` bytes with a filler file (delete it to free
    the space again); returns its path."""
    path = directory / name
    chunk = b"\0" * (1 << 20)
    # Unbuffered: what a write could not put on the disk (another process took the room
    # statvfs counted) must not wait in a buffer for the close, which would raise ENOSPC.
    with open(path, "ab", buffering=0) as out, contextlib.suppress(OSError):  # full already
        while (room := free_bytes(directory) - leave) > 0:
            out.write(chunk[: min(room, len(chunk))])
    return path
