"""mc0 brokers on NATS for tests: ``twistd -n eventbus --services mc0 --mc0-nats ...`` (its
/status and /metrics on a port of its own) or ``twistd -n mc0 --nats ...`` in a child process,
and connectors that record what they receive."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from tests.processes import TWISTD, TwistdProcess
from tests.test_product_process import environment, free_port


class ClusterBroker(TwistdProcess):
    """One broker of a topic space over NATS: the composed product's mc0 service, on a
    port of its own, CURVE with the key pair ``server_cert`` (or ``--plain`` without it)."""

    def __init__(
        self,
        workdir: Path,
        nats: str,
        *args: str,
        server_cert: Path | None = None,
        port: int | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = port or free_port()
        self.http_port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        security = ["--mc0-server-cert", str(server_cert)] if server_cert else ["--mc0-plain"]
        command = [
            TWISTD, "-n", "--pidfile=", "eventbus", "--services", "mc0",
            "--http-port", str(self.http_port), "--mc0-port", str(self.port),
            "--mc0-data-dir", str(workdir / "mc0-data"), *security, "--mc0-nats", nats, *args,
        ]  # fmt: skip
        super().__init__(command, workdir / "twistd.log", environment(), workdir)

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def status(self) -> dict[str, Any]:
        """The mc0 service's part of /status."""
        return dict(json.loads(self.get("/status"))["services"]["mc0"])

    def cluster(self) -> dict[str, Any]:
        """Its ``cluster`` section (the link and the relay)."""
        return dict(self.status().get("cluster") or {})

    def ready(self) -> bool:
        """Serving, its link to NATS up."""
        if self.process.poll() is not None:
            raise AssertionError(f"exited with {self.process.returncode}: {self.output()}")
        try:
            return bool(self.cluster().get("connected"))
        except (OSError, KeyError, ValueError):
            return False

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)


class Recorder:
    """What a connector's ``on_message`` got: each MESSAGE's topic and body frames."""

    def __init__(self) -> None:
        self.got: list[tuple[bytes, tuple[bytes, ...]]] = []

    def __call__(self, delivery: Any) -> None:
        self.got.append((delivery.topic, delivery.body))

    def bodies(self, topic: bytes | None = None) -> list[bytes]:
        return [body[0] for t, body in self.got if topic is None or t == topic]
