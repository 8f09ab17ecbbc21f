"""The console's rates kept on disk (bus.web.history): the ring files on their own (bounded
as they wrap, damaged ones repaired or started afresh), the recorder on an injected clock,
``/api/v1/history`` through real HTTP behind the token, and the product as operators run
it: samples accumulate, the process is killed (SIGKILL) and started again, and the
history still answers the points from before."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.application.service import Service
from twisted.internet import task

from bus.util.ringfile import HEADER_SIZE, SLOT_SIZE, RingFile
from bus.web.history import HistoryRecorder, RateArchive, file_name, series_of
from bus.web.server import StatusWebService
from tests.processes import CLEAN_EXIT, wait_for
from tests.test_console_browser import browser as browser  # fixtures, by name
from tests.test_console_browser import card_state, wait
from tests.test_console_browser import page as page
from tests.test_http_security import get
from tests.test_product_process import Product

# -- the ring file -------------------------------------------------------------------------


def test_a_ring_keeps_the_newest_ticks_and_never_grows(tmp_path: Path) -> None:
    path = tmp_path / "s.ring"
    ring = RingFile(path, interval=10.0, capacity=8)
    assert ring.opened == "created"
    size = path.stat().st_size
    assert size == HEADER_SIZE + 8 * SLOT_SIZE
    for tick in range(1000, 1020):  # wraps twice and a half
        ring.write(tick, tick / 2)
        assert path.stat().st_size == size
    assert list(ring.read(0, 1019)) == [(t, t / 2) for t in range(1012, 1020)]
    assert list(ring.read(0, 2000)) == []  # only the newest capacity ticks up to the last asked
    assert list(ring.read(1013, 1015)) == [(1013, 506.5), (1014, 507.0), (1015, 507.5)]
    # Ticks that were never written, or have been overwritten, are not returned.
    assert list(ring.read(1020, 1030)) == []
    assert list(ring.read(1004, 1008)) == []
    ring.close()
    again = RingFile(path, interval=10.0, capacity=8)
    assert again.opened == "opened" and len(list(again.read(1012, 1019))) == 8
    again.close()


def test_a_ring_cut_short_is_extended_and_keeps_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "s.ring"
    ring = RingFile(path, interval=1.0, capacity=10)
    for tick in range(100, 110):
        ring.write(tick, float(tick))
    ring.close()
    # Cut in the middle of the seventh slot (slot of tick 106, counting from tick 100).
    with open(path, "r+b") as file:
        file.truncate(HEADER_SIZE + 6 * SLOT_SIZE + 7)
    ring = RingFile(path, interval=1.0, capacity=10)
    assert ring.opened == "extended" and "bytes" in ring.why
    assert path.stat().st_size == HEADER_SIZE + 10 * SLOT_SIZE
    assert [t for t, _ in ring.read(100, 109)] == [100, 101, 102, 103, 104, 105]
    assert ring.invalid == 1  # the torn slot: its checksum is wrong
    ring.write(110, 1.5)  # and it goes on
    assert list(ring.read(110, 110)) == [(110, 1.5)]
    ring.close()


def test_a_ring_with_damaged_slots_skips_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "s.ring"
    ring = RingFile(path, interval=1.0, capacity=10)
    for tick in range(0, 10):
        ring.write(tick, 1.0)
    with open(path, "r+b") as file:
        file.seek(HEADER_SIZE + 3 * SLOT_SIZE + 9)
        file.write(b"\xff\xfe")
    assert [t for t, _ in ring.read(0, 9)] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert ring.invalid == 1
    ring.close()


@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "other shape"],
)
def test_a_ring_that_is_not_one_is_moved_aside_and_started_afresh(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "s.ring"
    if damage == "garbage":
        path.write_bytes(os.urandom(5000))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        RingFile(path, interval=5.0, capacity=10).close()
    ring = RingFile(path, interval=1.0, capacity=10)
    assert ring.opened == "reset" and ring.why
    assert path.with_name("s.ring.corrupt").exists()
    assert path.stat().st_size == HEADER_SIZE + 10 * SLOT_SIZE
    assert list(ring.read(0, 9)) == []
    ring.write(3, 2.0)
    assert list(ring.read(0, 9)) == [(3, 2.0)]
    ring.close()


# -- the archive and the recorder ---------------------------------------------------------


class Charted(Service):
    """A running service whose one charted counter the test sets."""

    console_rates = {"jobs": "done"}

    def __init__(self) -> None:
        self.done = 0
        self.running = True

    def status(self) -> dict[str, Any]:
        return {"done": self.done, "dropped": {"full": 0}}


def test_series_names_survive_their_file_names() -> None:
    for service, label in (("eventbus", "events"), ("a/b@c", "x y.z"), ("ü", "%41")):
        name = file_name(service, label)
        assert "/" not in name and series_of(name) == (service, label)
    assert series_of("other.txt") is None


def test_the_recorder_writes_rates_on_its_clock_and_the_directory_stays_bounded(
    tmp_path: Path,
) -> None:
    clock = task.Clock()
    clock.advance(1_000_000.0)
    service = Charted()
    archive = RateArchive(tmp_path / "h", interval=10.0, keep=60.0)
    recorder = HistoryRecorder([("work", service)], archive, clock)
    recorder.start()  # a first sample now, then a tenth into each ten seconds of the clock
    service.done += 55
    clock.advance(11.0)
    assert archive.query(0, clock.seconds())["series"]["work"]["jobs"] == [[1_000_010.0, 5.0]]
    sizes = set()
    for _ in range(30):  # five times round the ring
        service.done += 50
        clock.advance(10.0)
        sizes.add(sum(p.stat().st_size for p in (tmp_path / "h").iterdir()))
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == [
        "work@dropped.ring",
        "work@jobs.ring",
    ]
    assert sizes == {2 * (HEADER_SIZE + 6 * SLOT_SIZE)}
    answer = archive.query(0, clock.seconds())
    jobs = answer["series"]["work"]["jobs"]
    assert len(jobs) == 6 and all(value == 5.0 for _, value in jobs)  # 50 per 10 s
    assert [b[0] - a[0] for a, b in itertools.pairwise(jobs)] == [10.0] * 5
    assert answer["series"]["work"]["dropped"][-1][1] == 0.0
    # Fewer points asked: each the mean of several ticks.
    coarse = archive.query(0, clock.seconds(), ["work.jobs"], points=2)
    assert list(coarse["series"]) == ["work"] and list(coarse["series"]["work"]) == ["jobs"]
    assert [value for _, value in coarse["series"]["work"]["jobs"]] == [5.0, 5.0]
    assert coarse["step"] == 30.0
    # Its newest bucket asked again at the same step (as the page does each minute): the same.
    newest = archive.query(clock.seconds() - 25, clock.seconds(), ["work.jobs"], step=30.0)
    assert newest["step"] == 30.0
    assert newest["series"]["work"]["jobs"] == coarse["series"]["work"]["jobs"][-1:]
    recorder.stop()
    assert archive.status()["written"] == 2 * 31


def test_a_gap_in_sampling_gives_no_rate_across_it(tmp_path: Path) -> None:
    clock = task.Clock()
    clock.advance(5000.0)
    service = Charted()
    archive = RateArchive(tmp_path / "h", interval=1.0, keep=1000.0)
    recorder = HistoryRecorder([("work", service)], archive, clock)
    recorder.start()
    clock.advance(1.5)
    service.done = 10
    recorder.sample()
    clock.advance(100.0)  # as if the process had been stopped meanwhile
    service.done = 1000
    recorder.sample()
    points = archive.query(0, clock.seconds())["series"]["work"]["jobs"]
    assert all(value < 100 for _, value in points)
    recorder.stop()


# -- through HTTP ------------------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_the_history_is_served_behind_the_token(tmp_path: Path) -> Any:
    from bus.testing import wait_until

    token = tmp_path / "token"
    token.write_text("history-secret\n")
    service = Charted()
    web = StatusWebService(
        [("work", service)], 0, token_file=token, history_dir=tmp_path / "h", history_interval=0.05
    )
    web.startService()
    try:
        assert (yield get(web.port, "/api/v1/history"))[0] == 401
        assert (yield get(web.port, "/api/v1/history", "wrong"))[0] == 401

        def written() -> bool:
            service.done += 1
            return bool(web.status()["history"]["written"] >= 6)

        yield wait_until(written, timeout=30, what="samples written")
        code, headers, body = yield get(web.port, "/api/v1/history?range=1h", "history-secret")
        assert code == 200 and headers.getRawHeaders(b"content-type") == [b"application/json"]
        answer = json.loads(body)
        assert answer["source"] == "disk" and answer["interval"] == 0.05
        assert {"jobs", "dropped"} <= set(answer["series"]["work"])
        assert answer["series"]["work"]["jobs"]
        for query in ("range=-1", "range=soon", "points=0", "from=10&to=5", "to=nan", "step=-1"):
            code, _, body = yield get(web.port, f"/api/v1/history?{query}", "history-secret")
            assert code == 400 and "error" in json.loads(body), query
        code, _, body = yield get(web.port, "/api/v1/history?series=nothing", "history-secret")
        assert code == 200 and json.loads(body)["series"] == {}
    finally:
        yield web.stopService()


# -- the product, killed and started again ----------------------------------------------

HISTORY_ARGS = (
    "--services", "eventbus", "--port", "0", "--http-history-interval", "0.2s",
    "--http-history-keep", "10m",
)  # fmt: skip


def history_of(product: Product, query: str = "range=1h&points=10000") -> dict[str, Any]:
    return dict(json.loads(product.get(f"/api/v1/history?{query}")))


def written(product: Product) -> int:
    try:
        return int(product.status()["services"]["http"]["history"]["written"])
    except (OSError, KeyError, TypeError):
        return 0


def test_the_history_survives_a_kill_and_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "bus"
    first = Product(tmp_path, *HISTORY_ARGS, "--data-dir", str(data))
    try:
        wait_for(first.ready, what="the product started")
        # What the server reports written, not a guess at how long that takes.
        wait_for(lambda: written(first) >= 10, timeout=120, what="ten samples written")
        before = history_of(first)["series"]["eventbus"]["events"]
        assert before
    finally:
        first.stop(signal.SIGKILL)
    directory = data / "console-history"
    ring = directory / "eventbus@events.ring"
    capacity = math.ceil(600 / 0.2)
    assert ring.stat().st_size == HEADER_SIZE + capacity * SLOT_SIZE

    second = Product(tmp_path, *HISTORY_ARGS, "--data-dir", str(data))
    try:
        wait_for(second.ready, what="the product started again")
        after = history_of(second)["series"]["eventbus"]["events"]
        assert [point for point in after if point[0] <= before[-1][0]] == before
        history = second.status()["services"]["http"]["history"]
        assert history["files"]["reset"] == 0 and history["invalid_slots"] == 0
    finally:
        assert second.stop() in CLEAN_EXIT, second.output()


def test_a_torn_history_file_does_not_stop_the_product(tmp_path: Path) -> None:
    data = tmp_path / "bus"
    directory = data / "console-history"
    directory.mkdir(parents=True)
    (directory / "eventbus@events.ring").write_bytes(b"torn" * 7)
    (directory / "eventbus@dropped.ring").write_bytes(b"")
    product = Product(tmp_path, *HISTORY_ARGS, "--data-dir", str(data))
    try:
        wait_for(product.ready, what="the product started")
        wait_for(lambda: written(product) >= 4, timeout=120, what="samples written")
        history = product.status()["services"]["http"]["history"]
        assert history["files"]["reset"] == 2
        assert (directory / "eventbus@events.ring.corrupt").read_bytes() == b"torn" * 7
        assert history_of(product)["series"]["eventbus"]["events"]
        try:
            product.get("/api/v1/history?points=100000")
            raise AssertionError("a query past the limit was answered")
        except urllib.error.HTTPError as error:
            assert error.code == 400
        assert "started afresh" in product.output()
    finally:
        assert product.stop() in CLEAN_EXIT, product.output()


def test_the_history_is_off_with_nothing_to_keep(tmp_path: Path) -> None:
    product = Product(
        tmp_path, "--services", "eventbus", "--port", "0", "--data-dir", str(tmp_path / "bus"),
        "--http-history-keep", "0",
    )  # fmt: skip
    try:
        wait_for(product.ready, what="the product started")
        assert product.status()["services"]["http"]["history"] is None
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{product.http_port}/api/v1/history")
        assert refused.value.code == 404
        assert not (tmp_path / "bus" / "console-history").exists()
    finally:
        assert product.stop() in CLEAN_EXIT, product.output()


# -- in Chromium ---------------------------------------------------------------------------


def test_the_console_draws_the_past_on_load_after_a_restart(tmp_path: Path, page: Any) -> None:
    data = tmp_path / "bus"
    first = Product(tmp_path, *HISTORY_ARGS, "--data-dir", str(data))
    try:
        wait_for(first.ready, what="the product started")
        wait_for(lambda: written(first) >= 10, timeout=120, what="ten samples written")
        before = history_of(first)["series"]["eventbus"]["events"]
    finally:
        first.stop(signal.SIGKILL)
    second = Product(tmp_path, *HISTORY_ARGS, "--data-dir", str(data))
    try:
        wait_for(second.ready, what="the product started again")
        page.get(f"http://127.0.0.1:{second.http_port}/")
        wait(page, lambda d: card_state(d, "eventbus") == "up")
        chart = "#card-eventbus svg.spark"

        def past_drawn(driver: Any) -> bool:
            from selenium.common.exceptions import StaleElementReferenceException

            try:  # redrawn every second: read in one go
                svg = driver.find_element("css selector", chart)
                drawn = svg.get_attribute("data-past"), svg.get_attribute("data-from")
            except StaleElementReferenceException:
                return False
            return bool(drawn[0] and int(drawn[0]) > 0 and float(drawn[1]) <= before[-1][0])

        # The chart starts with the points kept before the kill, then goes on live.
        wait(page, past_drawn, 60)
        assert page.find_elements("css selector", chart + " polyline")
    finally:
        assert second.stop() in CLEAN_EXIT, second.output()


def test_a_series_that_cannot_be_opened_is_counted_and_the_others_go_on(tmp_path: Path) -> None:
    directory = tmp_path / "h"
    (directory / "work@jobs.ring").mkdir(parents=True)  # not a file at all
    archive = RateArchive(directory, interval=1.0, keep=10.0)
    archive.open()
    assert archive.files["unreadable"] == 1
    assert archive.record(100.0, {"work": {"jobs": 1.0, "dropped": 0.0}}) == 1
    assert archive.record(101.0, {"work": {"jobs": 1.0, "dropped": 0.0}}) == 1
    assert archive.files["unreadable"] == 1  # tried once, not at every sample
    assert archive.query(90.0, 101.0)["series"] == {
        "work": {"dropped": [[100.0, 0.0], [101.0, 0.0]]}
    }
    archive.close()


def test_the_history_is_kept_in_a_services_data_directory_never_the_working_one() -> None:
    """Without --http-history-dir: the Event BUS's data directory, else the first composed
    service's; a process with none (ZRE alone) keeps no history rather than write in the
    working directory, which several processes may share."""
    from bus.tap import _history

    def where(services: dict[str, dict[str, str]]) -> Path | None:
        options = {"http-history-keep": "24h", "http-history-interval": "10s"}
        return _history({**options, "service-options": services})["history_dir"]  # type: ignore[no-any-return]

    assert where({"zre": {}, "emqp": {"data-dir": "e"}, "eventbus": {"data-dir": "b"}}) == Path(
        "b/console-history"
    )
    assert where({"zre": {}, "emqp": {"data-dir": "e"}}) == Path("e/console-history")
    assert where({"zre": {}}) is None
