"""A planned restart of a JetStream cluster's servers, one at a time, without an election
(``bus-cluster roll``, ``step-down``, ``wait-current``; docs/cluster.md, "Restarting").

A nats-server killed while it leads a stream leaves the stream without a leader until
its followers elect another, 4-9 s later (nats-server's Raft timeouts). A planned stop
need not wait for that: for each server in turn,

1. its peers must be current (else stopping it would leave a group without a quorum);
2. every stream and consumer leader it holds steps down
   (``$JS.API.STREAM.LEADER.STEPDOWN``, ``$JS.API.CONSUMER.LEADER.STEPDOWN``): a current
   follower takes over at once, while the server still runs;
3. it is stopped in lame-duck mode (its clients are told to leave first, and it hands
   over what it still leads), and waited for until it exited;
4. it is started again, and waited for until it serves;
5. its replicas of every stream and consumer it holds are current again
   (``cluster.replicas[].current`` of ``$JS.API.STREAM.INFO`` and ``CONSUMER.INFO``);

then the next. Front-ends go the same way, one at a time, each waited for until its
``/status`` says it serves again.

Everything here blocks (a command-line tool's thread) and talks to the cluster through
:mod:`bus.nats.blocking`, on a server other than the one being restarted. How a server is
stopped and started is the caller's (:class:`Control`): commands an operator gives
(``systemctl`` over ``ssh``), or the processes of ``bus-cluster`` on this machine.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from bus.nats import handshake, jsapi
from bus.nats.blocking import Connection
from bus.nats.codec import ProtocolError
from bus.nats.credentials import shown
from bus.nats.handshake import ConnectError

#: How long each wait may take unless told otherwise (``--timeout``): a replica catching
#: up on a large stream takes a while.
DEFAULT_TIMEOUT = 300.0
#: Seconds between two readings of what is waited for.
POLL = 0.25
#: A replica is current only if its leader heard from it this recently (twice its Raft
#: heartbeat, 1 s).
HEARD = 2.0
#: Seconds before a leader that did not let go is asked again to step down.
STEP_DOWN_AGAIN = 3.0


class RollError(Exception):
    """A step did not do what it must: the roll stops there (one sentence, for the CLI)."""


# -- what JetStream says of a stream's or a consumer's replicas (no I/O) ---------------------


@dataclass(frozen=True, slots=True)
class Replica:
    """One follower as the group's leader sees it."""

    name: str
    current: bool
    lag: int
    offline: bool
    #: Seconds since the leader last heard from it.
    active: float = 0.0


@dataclass(frozen=True, slots=True)
class Group:
    """A stream's or a consumer's Raft group, as its info's ``cluster`` field says it."""

    stream: str
    #: The consumer's name; empty for the stream itself.
    consumer: str
    #: The server leading it (None while an election is under way).
    leader: str | None
    replicas: tuple[Replica, ...] = ()

    @property
    def name(self) -> str:
        """``stream NAME`` or ``consumer STREAM/NAME``, as the tool's lines say it."""
        return (
            f"consumer {self.stream}/{self.consumer}" if self.consumer else f"stream {self.stream}"
        )

    @property
    def peers(self) -> frozenset[str]:
        """Every server holding a replica (the leader included)."""
        names = {replica.name for replica in self.replicas}
        if self.leader:
            names.add(self.leader)
        return frozenset(names)

    @property
    def replicated(self) -> bool:
        """More than one replica: its leadership can move, and it survives a server."""
        return len(self.peers) > 1

    def current_on(self, server: str, heard_within: float = HEARD) -> bool:
        """``server``'s replica has everything the group committed (the leader has), and
        the leader heard from it within ``heard_within`` seconds: a replica that stopped
        stays "current" in the leader's eyes for a while when nothing is written."""
        if self.leader == server:
            return True
        return any(
            r.name == server and r.current and not r.offline and r.active <= heard_within
            for r in self.replicas
        )

    def behind(self, server: str) -> list[str]:
        """The peers other than ``server`` that are not current, each with its lag
        (``n2 (lag 312)``, ``n3 (offline)``); ``no leader`` while it has none."""
        if self.leader is None:
            return ["no leader"]
        said = []
        for replica in self.replicas:
            if replica.name == server or (
                replica.current and not replica.offline and replica.active <= HEARD
            ):
                continue
            said.append(
                f"{replica.name} (offline)"
                if replica.offline
                else f"{replica.name} (lag {replica.lag})"
            )
        return said

    def lag_of(self, server: str) -> str:
        """What the leader says of ``server``'s replica, in words."""
        if self.leader is None:
            return "no leader"
        for replica in self.replicas:
            if replica.name == server:
                if replica.offline:
                    return "offline"
                return f"lag {replica.lag}, last heard {replica.active:.1f} s ago"
        return "not among its replicas yet"


def group_of(info: dict[str, Any], stream: str, consumer: str = "") -> Group:
    """The group that a ``STREAM.INFO`` or ``CONSUMER.INFO`` answer describes. A lone
    server's group has a leader and no replicas; a group with no leader has none."""
    cluster = info.get("cluster") or {}
    replicas = tuple(
        Replica(
            str(each.get("name", "")),
            bool(each.get("current")),
            int(each.get("lag") or 0),
            bool(each.get("offline")),
            int(each.get("active") or 0) / 1e9,
        )
        for each in cluster.get("replicas") or ()
        if isinstance(each, dict)
    )
    leader = cluster.get("leader") or None
    return Group(stream, consumer, str(leader) if leader else None, replicas)


# -- the JetStream API, over a connection to a server that stays up --------------------------


class JetStreamApi:
    """JetStream's API on a blocking connection to one of ``servers`` (``connect`` makes
    one with the caller's TLS and credentials). :meth:`avoid` keeps the connection off a
    server about to stop; a request that fails moves it to the next server and is asked
    once more there."""

    def __init__(
        self,
        servers: Sequence[str],
        connect: Callable[[Sequence[str]], Connection],
        timeout: float = 5.0,
    ) -> None:
        self.servers = list(servers)
        self.timeout = timeout
        self._connect = connect
        self._connection: Connection | None = None
        self._avoid: str | None = None

    def avoid(self, url: str | None) -> None:
        """Use any server but ``url`` (None: any); a connection on it is closed now."""
        self._avoid = url
        if self._connection is not None and self._connection.server == url:
            self.close()

    def _connected(self) -> Connection:
        if self._connection is None:
            others = [url for url in self.servers if url != self._avoid]
            # After a failure the next server first: the list turns once per connection.
            self.servers = self.servers[1:] + self.servers[:1]
            self._connection = self._connect(others or self.servers)
        return self._connection

    def close(self) -> None:
        """Close the connection (a later request makes another)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def request(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """JetStream's answer (:class:`bus.nats.jsapi.JetStreamError` when it is an error);
        TimeoutError or OSError when no server answers, after one more try elsewhere."""
        payload = json.dumps(body).encode() if body is not None else b""
        for attempt in (1, 2):
            try:
                answer = self._connected().request(subject, payload, self.timeout)
                return jsapi.answer(answer.payload)
            except (OSError, ProtocolError, ConnectError) as error:
                self.close()
                if attempt == 2:
                    if isinstance(error, OSError):
                        raise
                    raise ConnectionError(str(error)) from None
        raise AssertionError("unreachable")

    def check(self) -> None:
        """Reach the servers and JetStream once (its account information):
        :class:`RollError` saying why not (refused credentials, no server answering, no
        JetStream), so that a wrong password is one line at once, not a wait."""
        try:
            self._connected()
        except (OSError, ProtocolError, ConnectError) as error:
            raise RollError(
                f"cannot reach {', '.join(map(shown, self.servers))}: {error}"
            ) from None
        try:
            self.request(f"{jsapi.API}.INFO")
        except (OSError, jsapi.JetStreamError) as error:
            raise RollError(f"JetStream does not answer: {error}") from None

    def _paged(self, subject: str, key: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        while True:
            page = self.request(subject, {"offset": len(found)})
            items = [each for each in page.get(key) or () if isinstance(each, dict)]
            found.extend(items)
            if not items or len(found) >= int(page.get("total") or 0):
                return found

    def groups(self) -> list[Group]:
        """Every stream of the account, and every consumer of each."""
        found = []
        for info in self._paged(f"{jsapi.API}.STREAM.LIST", "streams"):
            stream = str((info.get("config") or {}).get("name", ""))
            found.append(group_of(info, stream))
            for consumer in self._paged(f"{jsapi.API}.CONSUMER.LIST.{stream}", "consumers"):
                found.append(group_of(consumer, stream, str(consumer.get("name", ""))))
        return found

    def group(self, group: Group) -> Group:
        """``group`` read again."""
        if group.consumer:
            subject = f"{jsapi.API}.CONSUMER.INFO.{group.stream}.{group.consumer}"
        else:
            subject = jsapi.stream_info(group.stream)
        return group_of(self.request(subject), group.stream, group.consumer)

    def step_down(self, group: Group) -> None:
        """Ask ``group``'s leader to hand over to a current follower."""
        if group.consumer:
            subject = f"{jsapi.API}.CONSUMER.LEADER.STEPDOWN.{group.stream}.{group.consumer}"
        else:
            subject = f"{jsapi.API}.STREAM.LEADER.STEPDOWN.{group.stream}"
        self.request(subject)


def server_info(url: str, connect: Callable[[Sequence[str]], Connection]) -> dict[str, Any]:
    """The INFO of the server at ``url`` (a connection made to it alone, then closed)."""
    with connect([url]) as connection:
        return dict(connection.info)


def accepts(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``url`` takes connections (a lame duck no longer does)."""
    import socket

    address = handshake.server(url)
    try:
        socket.create_connection((address.host, address.port), timeout).close()
    except OSError:
        return False
    return True


# -- what is restarted, and how --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Server:
    """A nats-server of the cluster: its name (``server_name``) and client URL."""

    name: str
    url: str

    def fields(self) -> dict[str, str]:
        """What a command template may name: ``{name}``, ``{url}``, ``{host}``, ``{port}``."""
        address = handshake.server(self.url)
        return {"name": self.name, "url": shown(self.url), "host": address.host,
                "port": str(address.port)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class FrontEnd:
    """An Event BUS front-end, known by its ``/status`` URL."""

    status_url: str
    token: str | None = None

    def fields(self) -> dict[str, str]:
        """What a command template may name: ``{url}``, ``{host}``, ``{port}`` (its HTTP
        port's)."""
        parts = urlsplit(self.status_url)
        return {"url": self.status_url, "host": parts.hostname or "", "port": str(parts.port or 80)}

    def status(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """Its ``/status`` (the Event BUS service's part), or None while it does not
        answer."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        request = urllib.request.Request(self.status_url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status = json.load(answer)
        except urllib.error.HTTPError as error:
            if error.code == 401:
                raise RollError(f"{self.status_url}: 401, give --http-token-file") from None
            return None
        except (OSError, ValueError):
            return None
        found = (status.get("services") or {}).get("eventbus") if isinstance(status, dict) else None
        return found if isinstance(found, dict) else None

    def serving(self) -> bool:
        """Its ``/status`` answers and says its stream is connected."""
        status = self.status()
        return bool(status and (status.get("jetstream") or {}).get("connected"))


class Control(Protocol):
    """How a server or a front-end is stopped and started."""

    def stop(self, what: Server | FrontEnd) -> None:
        """Stop it (a nats-server in lame-duck mode, a front-end with SIGTERM), returning
        once it exited; :class:`RollError` when it could not."""

    def start(self, what: Server | FrontEnd) -> None:
        """Start it again (it may take a moment to serve: the roll waits for that)."""


TEMPLATE_FIELDS = ("name", "url", "host", "port")


def check_template(template: str) -> str:
    """A command template's fields are among :data:`TEMPLATE_FIELDS` (ValueError naming
    the one that is not)."""
    try:
        template.format(**{name: "x" for name in TEMPLATE_FIELDS})
    except KeyError as error:
        fields = ", ".join("{" + name + "}" for name in TEMPLATE_FIELDS)
        raise ValueError(f"unknown field {{{error.args[0]}}} (it may use {fields})") from None
    except (IndexError, ValueError) as error:
        raise ValueError(f"not a command template ({error})") from None
    return template


def shell(command: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` with the shell, its output on ours; its status in the result."""
    return subprocess.run(command, shell=True, check=False)


@dataclass
class Commands:
    """Commands an operator gives, run by the shell, each field's value quoted: the stop
    command must return once the process exited (``systemctl stop`` does; the unit
    nats-server ships stops it with SIGUSR2, its lame-duck mode)."""

    stop_template: str
    start_template: str
    #: What runs a command (:func:`shell`: the shell, its output on the tool's own).
    run: Callable[[str], subprocess.CompletedProcess[bytes]] = field(default=shell)

    def _run(self, template: str, what: Server | FrontEnd, step: str) -> None:
        fields = {key: shlex.quote(value) for key, value in what.fields().items()}
        command = template.format(**fields)
        done = self.run(command)
        if done.returncode != 0:
            raise RollError(f"the {step} command ({command}) ended with status {done.returncode}")

    def stop(self, what: Server | FrontEnd) -> None:
        """Run the stop command; a server that still takes clients once it returned did
        not stop (a lame duck closes its port at once), nor a front-end that answers."""
        self._run(self.stop_template, what, "stop")
        if isinstance(what, Server) and accepts(what.url):
            raise RollError(
                f"{what.name} still takes connections at {shown(what.url)} after the stop "
                "command returned: it did not stop"
            )
        if isinstance(what, FrontEnd) and what.status() is not None:
            raise RollError(
                f"the front-end at {what.status_url} still answers after the stop command returned"
            )

    def start(self, what: Server | FrontEnd) -> None:
        """Run the start command."""
        self._run(self.start_template, what, "start")


# -- the procedure ---------------------------------------------------------------------------


class Roll:
    """The steps of a planned restart (the module's text), saying each as it goes
    (``say``), each wait bounded by ``timeout``. ``doing`` is told what each step waits
    for (the CLI's line when Ctrl-C ends it)."""

    def __init__(
        self,
        api: JetStreamApi,
        say: Callable[[str], None] = print,
        timeout: float = DEFAULT_TIMEOUT,
        doing: Callable[[str], None] = lambda what: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api = api
        self.say = say
        self.timeout = timeout
        self.doing = doing
        self.clock = clock
        self.sleep = sleep
        #: What was done, one phrase each (the CLI's line when Ctrl-C ends it).
        self.done: list[str] = []

    # -- waiting

    def _until(
        self,
        what: str,
        check: Callable[[], str | None],
        timeout: float | None = None,
        step: bool = True,
    ) -> float:
        """Call ``check`` until it says nothing is missing (None), for up to the timeout;
        the seconds it took. ``check`` says what is still missing, for the error. A
        request nobody answered counts as missing (an election may be under way).
        ``step``: ``what`` is the step now (else a read within the step under way)."""
        if step:
            self.doing(what)
        bound = self.timeout if timeout is None else timeout
        began = self.clock()
        while True:
            try:
                missing = check()
            except (OSError, jsapi.JetStreamError) as error:
                missing = f"no answer ({error})"
            if missing is None:
                return self.clock() - began
            if self.clock() - began > bound:
                raise RollError(f"{what}: not done after {bound:g} s ({missing})")
            self.sleep(POLL)

    def _groups(self) -> list[Group]:
        found: list[list[Group]] = []

        def read() -> str | None:
            found[:] = [self.api.groups()]
            return None

        self._until("reading the streams and consumers", read, 60.0, step=False)
        return found[0]

    def name_of(self, url: str, connect: Callable[[Sequence[str]], Connection]) -> Server:
        """The server at ``url``, named as its INFO names it."""
        try:
            info = server_info(url, connect)
        except (OSError, ProtocolError, ConnectError) as error:
            raise RollError(f"{shown(url)}: {error}") from None
        name = info.get("server_name") or info.get("server_id")
        if not info.get("jetstream"):
            raise RollError(f"{shown(url)} ({name}) does not run JetStream")
        return Server(str(name), url)

    # -- the steps

    def holding(self, server: str) -> list[Group]:
        """The groups with a replica on ``server``; :class:`RollError` when none has one
        (a mistyped name, most likely), naming the servers that hold replicas."""
        groups = self._groups()
        held = [g for g in groups if server in g.peers]
        if not held:
            named = sorted({name for g in groups for name in g.peers})
            raise RollError(
                f"no stream or consumer has a replica on {server} (they are on "
                f"{', '.join(named) or 'no server'}): is the name right?"
            )
        return held

    def peers_current(self, server: str) -> list[Group]:
        """Wait until every group with a replica on ``server`` has its other replicas
        current, so that stopping ``server`` leaves each a quorum; those groups."""
        held: list[Group] = []

        def check() -> str | None:
            held[:] = [g for g in self.api.groups() if server in g.peers]
            behind = [
                f"{g.name}: {', '.join(g.behind(server))}"
                for g in held
                if g.replicated and g.behind(server)
            ]
            return "; ".join(behind) or None

        took = self._until(f"{server}'s peers to be current", check)
        alone = [g.name for g in held if not g.replicated]
        replicated = [g for g in held if g.replicated]
        self.say(
            f"{server}: holds {count(replicated, 'replicated group')}"
            + (f", every other replica current ({took:.1f} s)" if replicated else "")
            + (
                f"; {len(alone)} with a single replica there ({names(alone)}): "
                "unavailable while it restarts (clients make ephemeral readers again elsewhere)"
                if alone
                else ""
            )
        )
        return held

    def step_down(self, server: str) -> dict[str, str]:
        """Move every stream and consumer leadership off ``server`` (a current follower
        takes each over at once); where each went."""
        self.doing(f"{server}'s leaderships to move")
        led = [g for g in self._groups() if g.replicated and g.leader == server]
        if not led:
            self.say(f"{server}: leads no stream or consumer")
            return {}
        began = self.clock()
        asked: dict[str, float] = {}
        moved: dict[str, str] = {}

        def check() -> str | None:
            now = {g.name: g for g in self.api.groups()}
            missing = []
            for group in led:
                found = now.get(group.name)
                if found is None:
                    continue  # deleted meanwhile
                if found.leader == server:
                    # Asked again only after a while: the answer comes once the leader let
                    # go, and asked too soon the next leader would step down too.
                    if self.clock() - asked.get(group.name, -STEP_DOWN_AGAIN) >= STEP_DOWN_AGAIN:
                        asked[group.name] = self.clock()
                        self.api.step_down(found)
                    missing.append(f"{group.name} led by {server}")
                elif found.leader is None:
                    missing.append(f"{group.name} has no leader yet")
                else:
                    moved[group.name] = found.leader
            return "; ".join(missing) or None

        self._until(f"{server}'s leaderships to move", check)
        self.say(
            f"{server}: stepped down as leader of "
            + ", ".join(f"{name} (now {moved[name]})" for name in sorted(moved))
            + f" in {self.clock() - began:.2f} s"
        )
        return moved

    def restart(self, server: Server, control: Control) -> None:
        """The whole procedure for one server (the module's text)."""
        began = self.clock()
        self.api.avoid(server.url)
        held = self.peers_current(server.name)
        self.step_down(server.name)
        self.doing(f"stopping {server.name} (lame-duck mode)")
        stopping = self.clock()
        control.stop(server)
        self.done.append(f"{server.name} stopped")
        self.say(
            f"{server.name}: stopped in lame-duck mode, exited after {self.clock() - stopping:.1f} s"
        )
        self.doing(f"starting {server.name}")
        starting = self.clock()
        control.start(server)
        self._until(
            f"{server.name} to take connections again",
            lambda: None if accepts(server.url) else "its port refuses",
        )
        self.say(
            f"{server.name}: started, taking connections after {self.clock() - starting:.1f} s"
        )
        self.done[-1] = f"{server.name} restarted"
        self.wait_current(server.name, held, since=starting)
        self.say(f"{server.name}: done in {self.clock() - began:.1f} s")
        self.done[-1] = f"{server.name} restarted and current"
        self.api.avoid(None)

    def wait_current(
        self, server: str, held: Iterable[Group] | None = None, since: float | None = None
    ) -> None:
        """Wait until ``server``'s replica of every group it holds (``held``, else those the
        cluster says it holds now) is current, its leader having heard from it since
        ``since`` (the clock's time it was started at), when given."""
        groups = (
            list(held) if held is not None else [g for g in self._groups() if server in g.peers]
        )
        groups = [g for g in groups if g.replicated]
        if not groups:
            self.say(f"{server}: holds no replicated stream or consumer")
            return
        began = self.clock()
        for group in groups:

            def check(group: Group = group) -> str | None:
                now = self.api.group(group)
                heard = HEARD if since is None else min(HEARD, self.clock() - since)
                return None if now.current_on(server, heard) else now.lag_of(server)

            self._until(f"{server}'s replica of {group.name} to be current", check)
        self.say(
            f"{server}: its replicas of {names([g.name for g in groups])} are current "
            f"({self.clock() - began:.1f} s)"
        )

    def restart_front_end(
        self, front_end: FrontEnd, control: Control, others: Sequence[FrontEnd]
    ) -> None:
        """One front-end: the others must serve (its clients move there), then it is
        stopped (SIGTERM: it stores what it collected, then closes its ports), started
        again, and waited for until it serves."""
        url = front_end.status_url
        began = self.clock()
        self._until(
            f"the other front-ends to serve before {url} stops",
            lambda: ", ".join(o.status_url for o in others if not o.serving()) or None,
        )
        self.doing(f"stopping the front-end at {url}")
        control.stop(front_end)
        self.done.append(f"front-end {url} stopped")
        self.say(f"front-end {url}: stopped after {self.clock() - began:.1f} s")
        self.doing(f"starting the front-end at {url}")
        starting = self.clock()
        control.start(front_end)
        self._until(
            f"the front-end at {url} to serve again",
            lambda: None if front_end.serving() else "its /status does not say connected",
        )
        self.say(f"front-end {url}: serving again after {self.clock() - starting:.1f} s")
        self.done[-1] = f"front-end {url} restarted"


def count(items: Sequence[object], what: str) -> str:
    """``1 replicated group``, ``2 replicated groups``, ``no replicated group``."""
    if not items:
        return f"no {what}"
    return f"{len(items)} {what}{'s' if len(items) != 1 else ''}"


def names(items: Iterable[str], most: int = 6) -> str:
    """Names in a line, the first ``most`` of them."""
    listed = list(items)
    shown_names = ", ".join(listed[:most])
    return shown_names + (f" and {len(listed) - most} more" if len(listed) > most else "")
