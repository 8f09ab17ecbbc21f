"""Event BUS topics as NATS subjects, and subtrees as subject filters (sans I/O).

A topic is any non-empty UTF-8 of up to 4096 bytes; a NATS subject is dot-separated tokens
that may not hold ``.``, ``*``, ``>``, whitespace, or be empty. The encoding keeps every topic
and keeps subtrees cheap to find:

- the topic is split at each ``/`` into segments (``/orders/7/`` is ``""``, ``orders``,
  ``7``, ``""``), and each segment becomes one token after the subject's ``prefix``;
- in a segment, ASCII letters, digits, ``-`` and ``_`` stand for themselves; every other
  byte is ``~`` and two upper-case hex digits (``.`` is ``~2E``, ``é`` is ``~C3~A9``);
- an empty segment is a lone ``~`` (never the start of an escape, so it is unambiguous).

``/orders/7/`` under the prefix ``eventbus`` is ``eventbus.~.orders.7.~``. Decoding reverses
it exactly. A subtree (a byte prefix of topics, as SYNCSTART and SUB name them) becomes the
filter of its whole segments followed by ``>``: ``/orders/`` is ``eventbus.~.orders.>``.
When the subtree ends inside a segment (``/ord``) the filter is the coarser one of its
whole segments (``eventbus.~.>``) and :func:`covers` says the filter is not exact: the
reader checks each topic's bytes against the subtree itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from bus.nats.tokens import SubjectError
from bus.nats.tokens import token as _segment
from bus.nats.tokens import untoken as _unsegment

__all__ = ["SubjectError", "covers", "filters", "subject", "subtree_filter", "topic"]


def subject(prefix: str, topic: bytes) -> str:
    """The subject of ``topic`` under ``prefix`` (itself one or more valid tokens)."""
    return prefix + "." + ".".join(_segment(part) for part in topic.split(b"/"))


def topic(prefix: str, subject_: str) -> bytes:
    """The topic ``subject_`` names under ``prefix`` (:class:`SubjectError` otherwise)."""
    head = prefix + "."
    if not subject_.startswith(head):
        raise SubjectError(f"{subject_[:80]!r} is not under {prefix!r}")
    return b"/".join(_unsegment(token) for token in subject_[len(head) :].split("."))


def subtree_filter(prefix: str, subtree: bytes) -> str:
    """The subject filter that matches every topic starting with ``subtree`` (and, when
    the subtree ends inside a segment, others too: see :func:`covers`)."""
    whole = subtree.split(b"/")[:-1]  # the last part is partial (empty after a "/")
    return ".".join([prefix, *(_segment(part) for part in whole), ">"])


def covers(subtree: bytes) -> bool:
    """True when :func:`subtree_filter` matches exactly the topics under ``subtree``."""
    return not subtree or subtree.endswith(b"/")


def filters(prefix: str, subtrees: Iterable[bytes]) -> tuple[list[str], bool]:
    """The subject filters of several subtrees (every subject for none), without one
    another covers, and whether they are exact (no topic needs checking by its bytes)."""
    listed = list(subtrees)
    if not listed or any(not subtree for subtree in listed):
        return [prefix + ".>"], True
    found = sorted({subtree_filter(prefix, subtree) for subtree in listed})
    kept = [f for f in found if not any(o != f and f.startswith(o[:-1]) for o in found)]
    return kept, all(covers(subtree) for subtree in listed)
