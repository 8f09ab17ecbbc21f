"""The console's rates kept on disk: what its charts draw, past the page's lifetime and the
process's.

Every ``interval`` seconds (10 s by default), whether a console is open or not, the
counters the console charts (each service's ``console_rates`` and drops, see
:mod:`bus.web.console.view`) are read and their rates per second since the last sample
are written, one :class:`bus.util.ringfile.RingFile` per series (service and label) in
the history directory: ``keep`` seconds of them (24 hours by default), so the directory's
size is bounded by the series and never grows. A write is one small ``pwrite`` per series
and nothing is synced. ``GET /api/v1/history`` serves them to the page, which draws them
before the live rates go on. A file found damaged at start is repaired or started afresh,
counted and logged: history is never a reason not to start.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from twisted.internet import task, threads
from twisted.logger import Logger
from twisted.python.usage import UsageError
from twisted.web import resource, server

from bus.util.droplog import RateLimit
from bus.util.ringfile import RingFile
from bus.util.values import parse_duration
from bus.web.console.history import RateHistory
from bus.web.console.view import Named, counters, read_status

log = Logger(namespace="bus.web.history")

#: The most series kept (files in the directory); more are not recorded, and counted.
MAX_SERIES = 256
#: The most points of one series an answer holds (``points``); more are averaged together.
MAX_POINTS = 10000
SUFFIX = ".ring"

Rates = Mapping[str, Mapping[str, float]]


def file_name(service: str, label: str) -> str:
    """The file of one series: its service and label, %-encoded, joined by ``@``."""
    return f"{quote(service, safe='')}@{quote(label, safe='')}{SUFFIX}"


def series_of(name: str) -> tuple[str, str] | None:
    """The service and label a file of :func:`file_name` keeps (None: not such a file)."""
    if not name.endswith(SUFFIX) or name.count("@") != 1:
        return None
    service, label = name[: -len(SUFFIX)].split("@")
    return unquote(service), unquote(label)


class RateArchive:
    """The rates of every series in ``directory``: ``keep`` seconds at ``interval``.

    No clock of its own: times are given (seconds since the epoch), ticks are
    ``floor(time / interval)``."""

    def __init__(self, directory: Path, interval: float, keep: float) -> None:
        self.directory = directory
        self.interval = interval
        self.keep = keep
        self.capacity = max(1, math.ceil(keep / interval))
        self.rings: dict[tuple[str, str], RingFile] = {}
        #: What opening the files found, by what was done: created, extended (cut short),
        #: reset (not a ring of this shape: moved aside), unreadable (could not be opened).
        self.files: dict[str, int] = {"created": 0, "extended": 0, "reset": 0, "unreadable": 0}
        #: Samples written (one per series and tick), series not kept (past MAX_SERIES),
        #: writes that failed.
        self.written = 0
        self.series_refused = 0
        self.write_errors = 0
        #: The last tick written.
        self.last_tick: int | None = None
        self._unopened: set[tuple[str, str]] = set()

    def open(self) -> None:
        """Open the series the directory keeps (created if missing)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.iterdir()):
            series = series_of(path.name)
            if series is not None and len(self.rings) < MAX_SERIES:
                self._ring(series)

    def _ring(self, series: tuple[str, str]) -> RingFile | None:
        ring = self.rings.get(series)
        if ring is not None or series in self._unopened:
            return ring
        if len(self.rings) >= MAX_SERIES:
            self.series_refused += 1
            return None
        path = self.directory / file_name(*series)
        try:
            ring = RingFile(path, self.interval, self.capacity)
        except OSError as error:
            self._unopened.add(series)  # not tried again (nor logged) until the next start
            self.files["unreadable"] += 1
            log.warn("console history: cannot open {path}: {error}", path=str(path), error=error)
            return None
        if ring.opened != "opened":
            self.files[ring.opened] += 1
        if ring.opened in ("extended", "reset"):
            log.warn(
                "console history: {path} {what} ({why})",
                path=str(path),
                what="was cut short, extended" if ring.opened == "extended" else "started afresh",
                why=ring.why,
            )
        self.rings[series] = ring
        return ring

    def tick(self, when: float) -> int:
        """The tick of ``when``."""
        return math.floor(when / self.interval)

    def record(self, when: float, rates: Rates) -> int:
        """Write the rates of ``when``; the number of series written. Raises the first
        ``OSError`` of a write (after trying every series)."""
        tick = self.tick(when)
        failed: OSError | None = None
        count = 0
        for service, values in rates.items():
            for label, value in values.items():
                ring = self._ring((service, label))
                if ring is None:
                    continue
                try:
                    ring.write(tick, value)
                except OSError as error:
                    self.write_errors += 1
                    failed = failed or error
                    continue
                count += 1
        self.written += count
        self.last_tick = tick
        if failed is not None:
            raise failed
        return count

    def query(
        self,
        start: float,
        end: float,
        wanted: Iterable[str] = (),
        points: int = 1000,
        step: float = 0.0,
    ) -> dict[str, Any]:
        """The points from ``start`` to ``end`` of the series ``wanted`` names (``SERVICE``
        or ``SERVICE.LABEL``; none: all), at most ``points`` per series: when there are more
        ticks, each point is the mean of ``step`` seconds' worth (at least the ``step``
        asked), in buckets of the clock's (the same whatever the range: a page asks for the
        last minutes at the step it has and puts them in place). Never more than the ring
        keeps: an hour's query of a week ago reads nothing."""
        start = max(start, end - self.capacity * self.interval)
        first, last = math.ceil(start / self.interval), math.floor(end / self.interval)
        ticks = max(0, last - first + 1)
        per = max(1, math.ceil(ticks / max(1, points)), math.ceil(step / self.interval - 1e-9))
        names = set(wanted)
        found: dict[str, dict[str, list[list[float]]]] = {}
        for (service, label), ring in sorted(self.rings.items()):
            if names and service not in names and f"{service}.{label}" not in names:
                continue
            line: list[list[float]] = []
            bucket, total, count, at = None, 0.0, 0, 0
            for tick, value in ring.read(first, last):
                which = tick // per  # buckets of the clock's, not the query's: stable
                if which != bucket and count:
                    line.append([round(at * self.interval, 3), round(total / count, 3)])
                    total, count = 0.0, 0
                bucket, total, count, at = which, total + value, count + 1, tick
            if count:
                line.append([round(at * self.interval, 3), round(total / count, 3)])
            found.setdefault(service, {})[label] = line
        return {
            "interval": self.interval,
            "step": per * self.interval,
            "from": round(first * self.interval, 3),
            "to": round(last * self.interval, 3),
            "keep_s": self.capacity * self.interval,
            "series": found,
        }

    def status(self) -> dict[str, Any]:
        """What was kept and what went wrong, for ``/status``."""
        return {
            "directory": str(self.directory),
            "interval_s": self.interval,
            "keep_s": self.capacity * self.interval,
            "series": len(self.rings),
            "series_refused": self.series_refused,
            "written": self.written,
            "write_errors": self.write_errors,
            "invalid_slots": sum(ring.invalid for ring in self.rings.values()),
            "files": dict(self.files),
            "bytes": sum(ring.size for ring in self.rings.values()),
        }

    def close(self) -> None:
        """Close every file."""
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()


class HistoryRecorder:
    """Samples the services' counters every ``archive.interval`` seconds on ``reactor``
    and writes their rates to ``archive``."""

    def __init__(self, services: Named, archive: RateArchive, reactor: Any) -> None:
        self.services = services
        self.archive = archive
        self.reactor = reactor
        self._rates = RateHistory(length=1)
        self._loop: task.LoopingCall | None = None
        self._first: Any = None
        self._errors = RateLimit(reactor.seconds, 60.0)

    def start(self) -> None:
        """Open the archive and sample from now on: at once (the start of a run, no rates
        yet), then a tenth into each interval of the clock, so that each sample falls in
        a tick of its own however late the reactor is (up to nine tenths)."""
        self.archive.open()
        self.sample()
        interval = self.archive.interval
        delay = interval - self.reactor.seconds() % interval + interval / 10
        self._first = self.reactor.callLater(delay, self._begin)

    def _begin(self) -> None:
        self._first = None
        self._loop = task.LoopingCall(self.sample)
        self._loop.clock = self.reactor
        self._loop.start(self.archive.interval, now=True).addErrback(
            lambda failure: log.failure("console history sampling failed", failure)
        )

    def sample(self) -> None:
        """Read every service's counters and write their rates since the last sample."""
        counts: dict[str, dict[str, float]] = {}
        for name, service in self.services:
            status, _error = read_status(service)
            if service.running:
                counts[name] = counters(service, status)
        sample = self._rates.add(self.reactor.seconds(), counts, 2.5 * self.archive.interval)
        try:
            self.archive.record(sample["t"], sample["rates"])
        except OSError as error:
            times = self._errors.due("write")
            if times is not None:
                log.warn(
                    "console history: {times} writes failed: {error}", times=times, error=error
                )

    def stop(self) -> None:
        """Stop sampling and close the files."""
        if self._first is not None and self._first.active():
            self._first.cancel()
        self._first = None
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        self.archive.close()


def _number(request: Any, name: str, default: float) -> float:
    values = request.args.get(name.encode())
    if not values:
        return default
    text = values[0].decode("utf-8", "replace")
    try:
        value = parse_duration(text) if name == "range" else float(text)
    except UsageError:  # not a duration
        raise ValueError(text) from None
    if not math.isfinite(value):
        raise ValueError(name)
    return value


class HistoryResource(resource.Resource):
    """``GET /api/v1/history``: ``series`` (repeated: ``SERVICE`` or ``SERVICE.LABEL``; none:
    all), ``range`` (a duration back from now, ``1h`` by default) or ``from`` and ``to``
    (seconds since the epoch), ``points`` (the most per series, 1000 by default) and ``step``
    (seconds a point stands for at least)."""

    isLeaf = True

    def __init__(self, archive: RateArchive, reactor: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.archive = archive
        self.reactor = reactor

    def render_GET(self, request: Any) -> bytes | int:
        """The points asked for (JSON, read on a worker thread), or 400 and what the query
        may hold."""
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        now = self.reactor.seconds()
        try:
            span = _number(request, "range", 3600.0)
            end = _number(request, "to", now)
            start = _number(request, "from", end - span)
            points = int(_number(request, "points", 1000))
            step = _number(request, "step", 0.0)
            if span <= 0 or start > end or not 1 <= points <= MAX_POINTS or step < 0:
                raise ValueError("range")
            wanted = [v.decode("utf-8", "replace") for v in request.args.get(b"series", [])]
        except (ValueError, UnicodeDecodeError):
            request.setResponseCode(400)
            message = (
                "range: a duration (300, 1h); from and to: seconds since the epoch, from <= to; "
                f"points: 1 to {MAX_POINTS}; step: seconds; series: SERVICE or SERVICE.LABEL"
            )
            return json.dumps({"error": message}).encode() + b"\n"
        # A day of many series is a few hundred ms of reading and averaging: off the reactor
        # thread (the files are read with pread; the reactor's pwrites of single slots go on,
        # and a slot caught half written fails its check word and is skipped).
        done = threads.deferToThreadPool(
            self.reactor,
            self.reactor.getThreadPool(),
            self.archive.query,
            start,
            end,
            wanted,
            points,
            step,
        )
        finished: list[bool] = []
        request.notifyFinish().addBoth(finished.append)

        def answered(answer: dict[str, Any]) -> None:
            if finished:
                return  # the client went away
            answer["source"] = "disk"
            request.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
            request.finish()

        def failed(failure: Any) -> None:
            log.failure("reading the console's history", failure)
            if not finished:
                request.setResponseCode(500)
                request.write(b'{"error": "the history could not be read"}\n')
                request.finish()

        done.addCallbacks(answered, failed)
        return int(server.NOT_DONE_YET)
