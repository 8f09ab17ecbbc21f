"""Whole ZeroMQ messages a batch per call, in compiled code when it was built.

pyzmq costs about a microsecond per frame in Python objects: a ``Frame`` to learn whether
more frames follow, or an enum conversion in every ``getsockopt(RCVMORE)``. The Event
BUS's collector reads 7 frames per event and sends 6, so that cost is most of its reactor
thread's time. ``bus.transport._frames`` (C, built at install time when a compiler is
there) makes the same libzmq calls as pyzmq, a batch per call, through the libzmq that
pyzmq loaded. :data:`native` is that module, or None: not built, another pyzmq backend,
or ``BUS_NATIVE_FRAMES=0`` in the environment; :class:`bus.transport.zmqsocket.ZmqSocket`
then reads and sends through pyzmq, with the same results.
"""

from __future__ import annotations

from typing import Any, Protocol

from bus.util.compiled import compiled


class Frames(Protocol):
    """What ``bus.transport._frames`` offers (see its C source)."""

    def read(
        self, handle: int, budget: int, addresses: bool, user_ids: bool
    ) -> tuple[list[list[bytes]], int, list[str | None] | None, list[str] | None]:
        """At most ``budget`` whole messages, without blocking, and 0 when the budget ran out,
        EAGAIN when the socket had no more, or the errno of a failed receive; then each
        message's Peer-Address and User-Id when asked for (else None)."""
        ...

    def send(self, handle: int, messages: Any) -> tuple[int, int]:
        """Send each message without blocking, in order, until one fails: how many went out
        whole, and 0 or the failed send's errno (EAGAIN: the high-water mark)."""
        ...

    def readable(self, handle: int) -> bool:
        """A message waits to be read (``ZMQ_EVENTS`` has ``POLLIN``)."""
        ...


def _load() -> Frames | None:
    frames = compiled("bus.transport._frames", "BUS_NATIVE_FRAMES")
    if frames is None:
        return None
    try:
        import zmq.backend.cython._zmq as backend

        frames.bind(backend.__file__)
    except (ImportError, AttributeError, OSError):
        return None
    return frames  # type: ignore[no-any-return]


#: The compiled helper, bound to pyzmq's libzmq; None where it is not available.
native: Frames | None = _load()
