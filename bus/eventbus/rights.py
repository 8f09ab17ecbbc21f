"""What a CURVE client key may do on the Event BUS, from its certificate's metadata.

``publish = "/orders/,/billing/"``: the subtrees it may publish in (a PUB outside them is
dropped and counted); ``subscribe = "/orders/"``: the subtrees it may receive, live and in
snapshots (a wider subscription or SYNCSTART is narrowed to them). A key without an entry may
do everything, as may every client without an allow-list. Topics starting with ``$`` are the
server's own (heartbeats, probes): every subscriber receives them.
"""

from __future__ import annotations

from collections.abc import Mapping

from bus.eventbus.codec import PROBE_SUBTREE, RESERVED_PREFIX

#: No restriction: the key may use every topic.
EVERYTHING: None = None

Subtrees = tuple[bytes, ...] | None


def subtrees(metadata: Mapping[str, str], right: str) -> Subtrees:
    """The subtrees of ``right`` (``publish`` or ``subscribe``) in a certificate's metadata,
    or None when it names none (everything). An entry that names no subtree allows none."""
    value = metadata.get(right)
    if value is None:
        return EVERYTHING
    return tuple(part.strip().encode("utf-8") for part in value.split(",") if part.strip())


def publish_subtrees(metadata: Mapping[str, str]) -> Subtrees:
    """The subtrees a key may publish in (None: everywhere)."""
    return subtrees(metadata, "publish")


def subscribe_subtrees(metadata: Mapping[str, str]) -> Subtrees:
    """The subtrees a key may receive (None: everything)."""
    return subtrees(metadata, "subscribe")


def may_publish(topic: bytes, allowed: Subtrees) -> bool:
    """Whether ``topic`` is in the ``allowed`` subtrees."""
    return allowed is None or topic.startswith(allowed)


def narrow(wanted: bytes, allowed: Subtrees) -> list[bytes]:
    """The prefixes a subscription to ``wanted`` becomes: itself when it lies inside an
    allowed subtree (or the server's ``$`` topics), else the allowed subtrees inside it."""
    if allowed is None:
        return [wanted]
    within = (*allowed, RESERVED_PREFIX)
    if wanted.startswith(within):
        return [wanted]
    return [subtree for subtree in within if subtree.startswith(wanted)]


def narrow_snapshot(wanted: tuple[bytes, ...], allowed: Subtrees) -> tuple[bytes, ...]:
    """The subtrees a SYNCSTART for ``wanted`` (empty: all) is answered from. Never empty
    when narrowed: a request outside every allowed subtree gets the probe subtree, which
    holds no event (a lone SYNCEND)."""
    if allowed is None:
        return wanted
    narrowed: list[bytes] = []
    for subtree in wanted or (b"",):
        for part in narrow(subtree, allowed):
            if part != RESERVED_PREFIX and part not in narrowed:
                narrowed.append(part)
    return tuple(narrowed) or (PROBE_SUBTREE,)
