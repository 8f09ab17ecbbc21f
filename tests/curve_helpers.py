"""CURVE keys for tests: a server key pair and an allow-list of client certificates with
their rights, written as bus-keys writes them."""

from __future__ import annotations

from pathlib import Path

from bus.transport.certs import write_certificate
from bus.transport.curve import ClientCurve, CurveKeyPair
from bus.transport.curve_settings import CurveSettings


class Keys:
    """A server key pair and an allow-list directory in ``root``."""

    def __init__(self, root: Path, server: CurveKeyPair | None = None) -> None:
        self.root = root
        self.server = server or CurveKeyPair.generate()
        write_certificate(root, "server", self.server.public, self.server.secret, {})
        self.allowed = root / "clients"
        self.allowed.mkdir()

    @property
    def server_cert(self) -> Path:
        return self.root / "server.key_secret"

    def client(self, name: str, allowed: bool = True, **metadata: str) -> CurveKeyPair:
        """A client key pair; on the allow-list (with ``metadata`` as its rights) unless
        ``allowed`` is False."""
        keys = CurveKeyPair.generate()
        if allowed:
            write_certificate(self.allowed, name, keys.public, None, metadata)
        return keys

    def secret_file(self, name: str, **metadata: str) -> Path:
        """A client listed with ``metadata``, its key pair written as a command-line tool's
        ``--cert`` file (outside the allow-list); its path."""
        keys = self.client(name, **metadata)
        private = self.root / "private"
        write_certificate(private, name, keys.public, keys.secret, metadata)
        return private / f"{name}.key_secret"

    @property
    def server_key(self) -> Path:
        """The server's public certificate: a command-line tool's ``--server-key``."""
        return self.root / "server.key"

    def curve(self, name: str, allowed: bool = True, **metadata: str) -> ClientCurve:
        """What a client library takes to connect as a new client key."""
        return ClientCurve(self.server.public, self.client(name, allowed, **metadata))

    def settings(self) -> CurveSettings:
        return CurveSettings(self.server_cert, self.allowed, reload_interval=0.05)


def dash_led_pair() -> CurveKeyPair:
    """A key pair whose Z85 public key begins with ``-`` (one in 85 does): what argparse
    takes for an option unless the tools say otherwise."""
    while True:
        pair = CurveKeyPair.generate()
        if pair.public.startswith(b"-"):
            return pair
