"""A ZRE node's settings (no transport import: tap modules use it at option-parsing time)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bus.zre.codec import VERSION_36

DEFAULT_PORT = 5670


@dataclass(slots=True)
class ZreConfig:
    """A node's name, interface, beacon, groups, headers, dialect, peers and gossip, timeouts and
    bounds."""

    name: str = ""
    interface: str = "lo"
    #: UDP beacon port; 0: no beacon (discovery through ``peers`` or gossip only). None:
    #: :data:`DEFAULT_PORT`, or no beacon when gossip is configured (see :attr:`beacon_port`).
    port: int | None = None
    groups: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    version: int = VERSION_36
    peers: list[str] = field(default_factory=list)
    evasive: float = 5.0
    expired: float = 30.0
    beacon_interval: float = 1.0
    reap_interval: float = 1.0
    #: 20/ZRE: run the ZRE/LOG service (a SUB socket announced as X-ZRELOG).
    log_service: bool = True
    #: Peers found by beacon and not greeted yet, at most (anyone can forge a beacon).
    max_pending_peers: int = 100
    #: A peer found by beacon that sends no HELLO this long after our greeting is dropped.
    pending_expired: float = 5.0
    #: Share of the process's descriptor limit the node's per-peer sockets may hold.
    descriptor_share: float = 0.25
    #: The node's CURVE secret key (``NAME.key_secret``): it then speaks CURVE as zyre with
    #: a certificate does, and meets only nodes that do.
    cert: Path | None = None
    #: With ``cert``: only peers whose public keys are in this directory's ``*.key`` files
    #: (re-read when it changes); None: any key, as zyre.
    peer_certs: Path | None = None
    #: ZGOSSIP hub (zyre_gossip_bind): bind a ROUTER on this endpoint (``tcp://HOST:PORT``).
    gossip_bind: str | None = None
    #: ZGOSSIP hubs to be a client of (zyre_gossip_connect): ``tcp://HOST:PORT``, or with
    #: ``|KEY`` (the hub's Z85 public key; needs ``cert``) over CURVE.
    gossip_connect: list[str] = field(default_factory=list)
    #: Between our PINGs to the hubs (a zgossip hub forgets a client silent for 1 s).
    gossip_ping_interval: float = 0.4

    @property
    def gossip(self) -> bool:
        """Whether the node discovers peers through ZGOSSIP (a hub, a client, or both)."""
        return bool(self.gossip_bind or self.gossip_connect)

    @property
    def beacon_port(self) -> int:
        """The UDP port beaconed on, 0 for none: zyre's gossip mode sends no beacons
        (``zyre_gossip_bind`` and ``zyre_gossip_connect`` turn them off), so with gossip and
        no port given there is no UDP; a port given explicitly beacons beside gossip."""
        if self.port is not None:
            return self.port
        return 0 if self.gossip else DEFAULT_PORT
