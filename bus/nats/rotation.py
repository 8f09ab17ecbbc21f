"""The servers a client goes through, one connection at a time, sans I/O: both clients'
(:mod:`bus.nats.failover` for blocking connections, :mod:`bus.nats.client` on the
reactor) keep one.

- **Given, then discovered.** The servers given come first; then those a server's INFO
  names in ``connect_urls`` (the cluster's other client URLs, sent at connection and again
  as the cluster changes) that were not given, with the scheme of the URL that reached
  it. A front-end given one URL of a healthy cluster so survives that server's death.
- **After the last used.** Each attempt starts with the server after the one last
  reached, so a server that answers but cannot serve (a minority's) is left for the next.
- **Lame duck.** A server whose INFO says ``ldm`` is draining: :meth:`Rotation.elsewhere`
  orders the others first, so a client leaves it before it closes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from bus.nats import handshake
from bus.nats.handshake import ConnectError

__all__ = ["Rotation", "discovered", "server_key"]


def server_key(url: str) -> tuple[str, int]:
    """What makes two URLs the same server: its host (in lower case) and port, whatever
    the scheme or credentials; ConnectError for a URL that does not parse."""
    address = handshake.server(url)
    return address.host.lower(), address.port


def discovered(reached: str, connect_urls: Sequence[str]) -> list[str]:
    """URLs for a cluster's ``connect_urls`` (``host:port``), with the scheme and any
    credentials of ``reached``, the URL whose server sent them."""
    parts = urlsplit(reached if "://" in reached else "nats://" + reached)
    userinfo = parts.netloc.rpartition("@")[0]
    at = userinfo + "@" if userinfo else ""
    return [f"{parts.scheme}://{at}{address}" for address in connect_urls if address]


class Rotation:
    """The servers (:attr:`servers`: given, then discovered) and where the next attempt
    starts (see the module's text)."""

    def __init__(self, servers: Sequence[str], discover: bool = True) -> None:
        if not servers:
            raise ConnectError("no NATS server given")
        for url in servers:
            handshake.server(url)  # a URL that names no server fails now, not in a minute
        self.servers = list(servers)
        self.discover = discover
        self._known = {server_key(url) for url in self.servers}
        self._next = 0

    def order(self) -> list[str]:
        """Every server, from the one after the last reached."""
        return self.servers[self._next :] + self.servers[: self._next]

    def elsewhere(self, leaving: str) -> list[str]:
        """Every server but ``leaving`` (one in lame-duck mode), in :meth:`order`."""
        return [url for url in self.order() if url != leaving]

    def take(self) -> str:
        """The next server to try (one attempt at a time), and the one after it next."""
        url = self.servers[self._next % len(self.servers)]
        self._next = (self._next + 1) % len(self.servers)
        return url

    def reached(self, url: str, info: Mapping[str, Any]) -> list[str]:
        """``url``'s server admitted us with ``info``: the next attempt starts after it.
        The servers learnt from ``info`` (see :meth:`learn`)."""
        added = self.learn(url, info)
        if url in self.servers:
            self._next = (self.servers.index(url) + 1) % len(self.servers)
        return added

    def learn(self, reached: str, info: Mapping[str, Any]) -> list[str]:
        """Add the servers ``info`` (an INFO from ``reached``'s server) names that are not
        known yet; the URLs added."""
        urls = info.get("connect_urls") if self.discover else None
        if not isinstance(urls, list):
            return []
        added = []
        for url in discovered(reached, [u for u in urls if isinstance(u, str)]):
            try:
                key = server_key(url)
            except ConnectError:
                continue
            if key not in self._known:
                self._known.add(key)
                self.servers.append(url)
                added.append(url)
        return added
