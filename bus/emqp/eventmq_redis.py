"""The schedules eventmq 0.3.13's scheduler keeps in Redis, read for ``emqp-cli schedules import``.

What eventmq stores (its ``scheduler.py``, ``on_schedule``): the list ``interval_jobs``
names every schedule, interval and cron alike, by its hash (the SHA-1 hex of its job, the id
:func:`bus.emqp.schedules.schedule_id` computes); the string key of that hash holds the
SCHEDULE's five fields as a JSON list, ``[queue, headers, interval, body, cron]``: interval
``"-1"`` with a cron line, or seconds with ``""``; the body is the JSON text of the job
(``["run", {...}]``); ``run_count:N`` in the headers is the runs left (the scheduler writes
it down after each run). Under Python 3 its check for a hash already listed never matches
(bytes against text), so a hash is listed again at each SCHEDULE of the same job: listed
hashes are taken once here.

:func:`stored_schedule` judges one key's value (no I/O). :func:`read_redis` reads a running
Redis through the ``redis`` package (the ``redis`` extra: ``pip install "bus[redis]"``), and
:func:`read_dump` a dump file (RDB) by loading it into a private ``redis-server`` that
listens on a Unix socket only, saves nothing, and is stopped once read. The RDB format is
not parsed here: its encodings change with Redis releases (ziplists became listpacks in 7.0,
new hash types came in 7.4), eventmq's Redis is often the application's own (``RQ_HOST``),
so a dump holds keys of any type, a module's among them, which only the module can skip;
``redis-server`` reads every older version of its own format.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bus.util.extras import MissingExtra, require

#: The list of the hashes of eventmq's schedules.
INDEX_KEY: Final = b"interval_jobs"
#: How long a private redis-server gets to load a dump.
DUMP_LOAD_SECONDS: Final = 120.0


class RedisReadError(Exception):
    """Redis could not be read: the message says why, in one sentence."""


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """One schedule as eventmq stored it: its hash (the Redis key) and the SCHEDULE fields;
    ``problem``: why it cannot be imported as it is (None: it can)."""

    key: str
    queue: bytes = b""
    headers: bytes = b""
    interval: bytes = b""
    body: bytes = b""
    cron: bytes = b""
    problem: str | None = None

    @property
    def fields(self) -> list[bytes]:
        """The five SCHEDULE fields, as eventmq's client sends them."""
        return [self.queue, self.headers, self.interval, self.body, self.cron]

    def without_haste(self) -> StoredSchedule:
        """The same with ``nohaste`` in its headers: it first runs after one interval (cron:
        at its next time), as eventmq's scheduler resumes it after a restart."""
        names = [part.strip() for part in self.headers.split(b",") if part.strip()]
        if b"nohaste" in names:
            return self
        headers = b",".join([*names, b"nohaste"])
        return StoredSchedule(
            self.key, self.queue, headers, self.interval, self.body, self.cron, self.problem
        )


def _text(value: Any) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    return None


def stored_schedule(key: bytes, value: bytes | None) -> StoredSchedule:
    """The schedule eventmq keeps under ``key`` (its hash) as ``value`` (None: the key is
    listed in ``interval_jobs`` but gone)."""
    name = key.decode("utf-8", "replace")
    if value is None:
        return StoredSchedule(name, problem="listed in interval_jobs, but its key is gone")
    try:
        message = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return StoredSchedule(name, problem="its value is not JSON")
    if not isinstance(message, list) or len(message) != 5:
        return StoredSchedule(
            name, problem="its value is not eventmq's [queue, headers, interval, body, cron]"
        )
    fields = [_text(item) for item in message]
    if any(item is None for item in fields):
        return StoredSchedule(name, problem="a field of its value is not text")
    queue, headers, interval, body, cron = (item or b"" for item in fields)
    return StoredSchedule(name, queue, headers, interval, body, cron)


def _unique(hashes: list[bytes]) -> list[bytes]:
    return list(dict.fromkeys(hashes))


def _redis_module() -> Any:
    try:
        return require("redis", "redis", "reading eventmq's Redis", package="the redis package")
    except MissingExtra as error:
        raise RedisReadError(str(error)) from None


def _read(client: Any, where: str) -> tuple[list[StoredSchedule], int]:
    """The schedules listed in ``interval_jobs`` (each hash once) and how many hashes the
    list holds in all."""
    redis = _redis_module()
    try:
        kind = client.type(INDEX_KEY)
        if kind == b"none":
            return [], 0
        if kind != b"list":
            raise RedisReadError(
                f"{where}: interval_jobs is a {kind.decode()}, not eventmq's list of schedules"
            )
        listed = client.lrange(INDEX_KEY, 0, -1)
        hashes = _unique(listed)
        values = client.mget(hashes) if hashes else []
    except redis.RedisError as error:
        raise RedisReadError(f"{where}: {error}") from None
    return [stored_schedule(k, v) for k, v in zip(hashes, values, strict=True)], len(listed)


def read_redis(url: str, timeout: float = 10.0) -> tuple[list[StoredSchedule], int]:
    """eventmq's schedules in the running Redis at ``url`` (``redis://[:password@]host:port/db``,
    ``rediss://``, ``unix://``), and how many hashes its list holds."""
    redis = _redis_module()
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    except ValueError as error:
        raise RedisReadError(f"--redis {url!r} is not a Redis URL ({error})") from None
    try:
        return _read(client, url)
    finally:
        client.close()


@contextlib.contextmanager
def _private_server(dump: Path, program: str, database: int) -> Iterator[Any]:
    """A redis-server that loaded ``dump``, on a Unix socket in a directory of its own, with
    saving off (the dump is never written); a client of it. Stopped on the way out."""
    redis = _redis_module()
    with tempfile.TemporaryDirectory(prefix="emqp-import-") as scratch:
        directory = Path(scratch)
        (directory / "dump.rdb").symlink_to(dump.resolve())
        socket_path = directory / "redis.sock"
        log_path = directory / "redis.log"
        command = [
            program, "--port", "0", "--unixsocket", str(socket_path), "--dir", str(directory),
            "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no",
            "--logfile", str(log_path), "--daemonize", "no",
        ]  # fmt: skip
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except OSError as error:
            raise RedisReadError(f"redis-server {program!r} cannot be run: {error}") from None
        client = redis.Redis(unix_socket_path=str(socket_path), db=database, socket_timeout=10.0)
        try:
            deadline = time.monotonic() + DUMP_LOAD_SECONDS
            while True:
                if process.poll() is not None:
                    raise RedisReadError(
                        f"redis-server could not load {dump}: {_last_words(log_path, process)}"
                    )
                try:
                    if socket_path.exists() and client.ping():
                        break
                except (redis.BusyLoadingError, redis.ConnectionError):
                    pass
                except redis.RedisError as error:  # e.g. no such database
                    raise RedisReadError(f"{dump} (database {database}): {error}") from None
                if time.monotonic() > deadline:
                    raise RedisReadError(
                        f"redis-server did not load {dump} within {DUMP_LOAD_SECONDS:g} s"
                    )
                time.sleep(0.05)
            yield client
        finally:
            client.close()
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
            if process.stderr is not None:
                process.stderr.close()


def _last_words(log_path: Path, process: subprocess.Popen[bytes]) -> str:
    """What redis-server said last about why it stopped: its log's warnings (``#``), the
    generic closing line and the memory advice left out."""
    lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    warnings = [line.split(" # ", 1)[1].strip() for line in lines if " # " in line]
    said = [
        text
        for text in warnings
        if not text.startswith(("WARNING", "Server initialized", "Fatal error loading the DB"))
    ]
    if said:
        return said[-1]
    if warnings:
        return warnings[-1]
    if process.stderr is not None:
        errors = process.stderr.read().decode(errors="replace").split("\n")
        if any(line.strip() for line in errors):
            return [line for line in errors if line.strip()][-1].strip()
    return f"it exited with status {process.returncode}"


def read_dump(
    dump: Path, database: int = 0, program: str | None = None
) -> tuple[list[StoredSchedule], int]:
    """eventmq's schedules in database ``database`` of a Redis dump file (RDB), read through
    a private redis-server (``program``, or the one on PATH)."""
    if not dump.is_file():
        raise RedisReadError(f"--rdb {dump}: no such file")
    server = program or shutil.which("redis-server")
    if server is None:
        raise RedisReadError(
            "reading a dump file needs redis-server (Debian: apt-get install redis-server;"
            " or give --redis-server PATH), or read the running Redis with --redis URL"
        )
    with _private_server(dump, server, database) as client:
        return _read(client, f"{dump} (database {database})")
