"""``--cpu-latency-us``: the product, or a plugin run alone, holds a PM QoS request on
/dev/cpu_dma_latency from before its first service starts until after its last one stopped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.application.cpulatency import DEVICE, CpuLatencyService, current
from bus.errors import StartupError
from bus.tap import Options, compose
from tests.ports import free_ports

from .processes import CLEAN_EXIT, TWISTD, TwistdProcess, reported
from .test_product_process import environment

#: A bound no one else on a test machine asks for, so that the kernel's minimum is ours.
BOUND = 7

writable = pytest.mark.skipif(
    not os.access(DEVICE, os.W_OK), reason=f"{DEVICE} is not writable here (not root)"
)


class Broker(TwistdProcess):
    """``twistd -n eventbus --services emqp --cpu-latency-us N``: the product's option
    around the service that wants it most; ``alone``: ``twistd -n emqp --cpu-latency-us N``,
    the plugin by itself."""

    def __init__(self, workdir: Path, *args: str, alone: bool = False) -> None:
        port = free_ports(3)
        plugin = ["emqp"] if alone else ["eventbus", "--services", "emqp", "--http-port", "0"]
        flag = "--" if alone else "--emqp-"  # the broker's options, prefixed in the product
        command = [
            TWISTD, "-n", "--pidfile=", *plugin,
            f"{flag}worker-port", str(port), f"{flag}client-port", str(port + 1),
            f"{flag}admin-port", str(port + 2), f"{flag}data-dir", str(workdir / "emqp"), *args,
        ]  # fmt: skip
        super().__init__(command, workdir / "twistd.log", environment(), workdir)

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"exited with {self.process.returncode}: {self.output()}")
        return "started cpu-latency, emqp" in self.output()


@writable
@pytest.mark.parametrize("alone", [False, True], ids=["product", "plugin-alone"])
@pytest_twisted.inlineCallbacks
def test_the_product_holds_the_bound_while_it_runs_and_lets_go_when_it_stops(
    tmp_path: Path, alone: bool
) -> Any:
    assert current() > BOUND
    broker = Broker(tmp_path, "--cpu-latency-us", str(BOUND), alone=alone)
    try:
        yield reported(broker.ready, what="the broker")
        assert current() == BOUND
        assert f"wake-up latency at {BOUND} us" in broker.output()
    finally:
        code = broker.stop()
    assert code in CLEAN_EXIT, broker.output()
    assert current() > BOUND
    log = broker.output()
    # Released only after the broker stopped.
    assert log.index("stopped emqp") < log.index("stopped cpu-latency")


def test_it_is_off_unless_asked_for_and_then_held_first() -> None:
    options = Options()
    options.parseOptions(["--services", "emqp", "--http-port", "0"])
    assert [c.name for c in compose(options).composed] == ["emqp"]
    options = Options()
    options.parseOptions(["--services", "emqp", "--http-port", "0", "--cpu-latency-us", "0"])
    assert [c.name for c in compose(options).composed] == ["cpu-latency", "emqp"]


def test_a_plugin_alone_holds_it_first_when_asked() -> None:
    from bus.emqp import tap as emqp_tap

    for argv, names in (([], ["emqp"]), (["--cpu-latency-us", "0"], ["cpu-latency", "emqp"])):
        options = emqp_tap.Options()
        options.parseOptions(
            ["--worker-port", "0", "--client-port", "0", "--admin-port", "0", *argv]
        )
        assert [c.name for c in emqp_tap.makeService(options).composed] == names


def test_a_negative_bound_is_a_usage_error() -> None:
    from twisted.python import usage

    with pytest.raises(usage.UsageError, match="cpu-latency-us"):
        Options().parseOptions(["--cpu-latency-us", "-1"])


def test_a_device_it_cannot_write_is_one_startup_line(tmp_path: Path) -> None:
    service = CpuLatencyService(0, path=str(tmp_path / "no-such-device"))
    with pytest.raises(StartupError) as caught:
        service.startService()
    assert caught.value.option == "cpu-latency-us"
    assert "No such file or directory" in caught.value.cause
    assert not service.running
