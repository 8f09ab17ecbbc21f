"""``twistd -n echo``; composed, the ``echo`` service of ``twistd -n eventbus`` (options
prefixed ``--echo-``, from ``ECHO_*`` variables and the ``[echo]`` table of ``--config``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.extension import ServiceOptions

if TYPE_CHECKING:
    from bus.extension import Composition, ProductService
    from echo_service.service import EchoService

#: Started after these services (when they run): it publishes onto the Event BUS.
AFTER = ("eventbus",)


class Options(ServiceOptions):
    service = "echo"
    env_prefix = "ECHO"
    synopsis = "[--bind 127.0.0.1] [--port 5600]"
    longdesc = "Echo [ECHO, payload] back as [ECHO-OK, payload] on a ZeroMQ ROUTER."
    optParameters = [
        ["bind", None, "127.0.0.1", "Address of the ROUTER."],
        ["port", None, 5600, "Port of the ROUTER (0: pick one).", int],
        ["max-bytes", None, 65536, "Largest payload echoed.", int],
    ]

    def postOptions(self) -> None:
        if not 0 <= self["port"] <= 65535:
            raise usage.UsageError("--port must be 0-65535")
        if self["max-bytes"] < 0:
            raise usage.UsageError("--max-bytes cannot be negative")


def build(options: usage.Options | dict[str, Any], composition: Composition) -> EchoService:
    """The service, given what the product hands every service (here: the bus's sink)."""
    from echo_service.service import EchoService

    return EchoService(
        options["bind"],
        int(options["port"]),
        int(options["max-bytes"]),
        activity=composition.activity("echo"),
        reactor=composition.reactor,
    )


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """``twistd -n echo``: the service alone, with the product's start and stop rules."""
    from bus.extension import standalone

    return standalone("echo", build, options)
