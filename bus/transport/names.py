"""How a peer's ZeroMQ identity is shown to people (logs, /status, the console)."""

from __future__ import annotations


def peer_name(identity: bytes) -> str:
    """A ROUTER identity for people: its text when it is UTF-8 (the original's UUIDs)."""
    try:
        text = identity.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + identity.hex()
    return text if text.isprintable() else "0x" + identity.hex()
