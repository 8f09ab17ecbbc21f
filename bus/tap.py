"""``twistd -n eventbus``: the whole product, one :class:`~bus.composition.ProductService`
holding a service per protocol, plus ``/status`` and ``/metrics`` over HTTP.

``--services`` chooses the services (default: every protocol). The Event BUS's own options are
the product's, without a prefix (``--port``); every other service's options are offered with
its name as prefix (``--spark-bridge-journal-dir``), derived from that service's own
``Options`` (:mod:`bus.services` lists them), so each is written once. Precedence, for every
option of every service: command line > environment > ``--config`` file > default.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.composition import Composition, ProductService, hold_cpu_latency
from bus.eventbus.tap import Options as EventBusOptions
from bus.options import PROCESS_OPTION_NAMES, OptionSpec, ServiceOptions
from bus.services import SERVICE_NAMES, SERVICES, entry

if TYPE_CHECKING:
    from twisted.application.service import Service

DEFAULT_HTTP_PORT = 8642
DEFAULT_SERVICES = tuple(service.name for service in SERVICES if service.default)


def service_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """``eventbus,spark-bridge`` (or a TOML list) -> names, checked, in start order."""
    names = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
    chosen = {str(name) for name in names if str(name)}
    unknown = sorted(chosen - set(SERVICE_NAMES))
    if unknown:
        raise usage.UsageError(
            f"--services: no service named {unknown[0]!r}; valid: {', '.join(SERVICE_NAMES)}"
        )
    if not chosen:
        raise usage.UsageError(f"--services: name at least one of {', '.join(SERVICE_NAMES)}")
    return tuple(name for name in SERVICE_NAMES if name in chosen)


def _prefix(service: str) -> str:
    """How a service's options are spelled in the product: the Event BUS's bare."""
    return "" if service == "eventbus" else f"{service}-"


class _ProductOptions(ServiceOptions):
    service = "eventbus"
    env_prefix = "EVENTBUS"
    synopsis = "[options]"
    longdesc = (
        "Serve the product: the Event BUS (SNAPSHOT on PORT, PUBLISHER on PORT+1, COLLECTOR on "
        "PORT+2, a durable log in DATA-DIR) and the other services named by --services, each "
        "with its options prefixed by its name (--spark-bridge-journal-dir). /status and "
        "/metrics are served over HTTP on --http-port."
    )
    optFlags = [
        [
            "spark-bridge",
            None,
            "Also journal this bus's feed for PySpark (adds spark-bridge to --services).",
        ],
    ]
    optParameters = [
        [
            "services",
            None,
            ",".join(DEFAULT_SERVICES),
            f"Services to run, comma-separated, of: {', '.join(SERVICE_NAMES)}.",
            service_list,
        ],
        [
            "http-port",
            None,
            DEFAULT_HTTP_PORT,
            "Port of /status and /metrics, on the Event BUS's --bind address (0: off).",
            int,
        ],
        ["journal-dir", None, None, "Same as --spark-bridge-journal-dir."],
    ]
    #: service -> Options class, for the options offered with its prefix.
    service_options: dict[str, type[ServiceOptions]] = {}

    def __init__(self) -> None:
        ServiceOptions.__init__(self)
        self.forwarded: dict[str, list[str]] = {name: [] for name in SERVICE_NAMES}
        self._tables: dict[str, dict[str, Any]] = {}
        self._path = ""

    def forward(self, service: str, *args: str) -> None:
        self.forwarded[service].extend(args)

    def apply_defaults(
        self,
        tables: Any,
        environ: Any,
        path: str = "",
        also_known: Any = (),
    ) -> None:
        # The [eventbus] table also holds the Event BUS's own options: its Options checks them.
        self._tables, self._path = dict(tables), path
        own = {spec.name for spec in EventBusOptions.option_specs()}
        ServiceOptions.apply_defaults(self, tables, environ, path, also_known=own)

    def no_match_hint(self) -> str:
        prefixes = ", ".join(f"--{_prefix(name)}..." for name in SERVICE_NAMES if _prefix(name))
        return f"the Event BUS's options are bare, the others' prefixed: {prefixes}"

    def postOptions(self) -> None:
        chosen = list(service_list(self["services"]))
        if self["spark-bridge"] and "spark-bridge" not in chosen:
            chosen.append("spark-bridge")
        if self["journal-dir"]:
            self.forwarded["spark-bridge"][:0] = ["--journal-dir", self["journal-dir"]]
        for name, args in self.forwarded.items():
            if args and name not in chosen and name != "eventbus":
                raise usage.UsageError(
                    f"{args[0].replace('--', '--' + _prefix(name), 1)} is an option of {name}, "
                    f"which is not among --services ({', '.join(chosen)})"
                )
        self["services"] = tuple(name for name in SERVICE_NAMES if name in chosen)
        parsed: dict[str, ServiceOptions] = {}
        for name in self["services"]:
            sub = self.service_options[name]()
            try:
                ServiceOptions.apply_defaults(
                    sub,
                    self._tables,
                    os.environ,
                    self._path,
                    also_known=PRODUCT_OPTION_NAMES,
                )
                sub.parse_command_line(self.forwarded[name])
            except usage.UsageError as error:
                message = str(error)
                if _prefix(name):
                    message = message.replace("--", f"--{_prefix(name)}")
                raise usage.UsageError(message) from None
            for option in PROCESS_OPTION_NAMES:
                if sub.get(option) is not None:  # from its table or its environment
                    raise usage.UsageError(
                        f"{option} is an option of the whole process, not of {name}: set it "
                        f"as --{option}, EVENTBUS_{option.upper().replace('-', '_')} or in the "
                        "[eventbus] table"
                    )
            parsed[name] = sub
        self["service-options"] = parsed


PRODUCT_OPTION_NAMES = frozenset(spec.name for spec in _ProductOptions.option_specs())


def _forwarder(service: str, spec: OptionSpec) -> Callable[..., None]:
    """An ``opt_`` method handing one option of ``service`` over to its own Options."""
    flag = f"--{spec.name}"
    doc = (
        spec.doc
        if spec.kind != "parameter" or spec.default in (None, "")
        else (f"{spec.doc} [default: {spec.default}]")
    )
    if spec.kind == "flag":

        def flag_handler(self: _ProductOptions) -> None:
            self.forward(service, flag)

        flag_handler.__doc__ = doc
        return flag_handler

    def handler(self: _ProductOptions, value: str) -> None:
        self.forward(service, flag, value)

    handler.__doc__ = doc + (" (repeatable)" if spec.kind == "multi" else "")
    return handler


def _product_options_class() -> type[_ProductOptions]:
    """The product's Options: its own, plus each service's, by one mechanism."""
    namespace: dict[str, Any] = {"service_options": {}}
    for service in SERVICES:
        options_class = importlib.import_module(service.tap).Options
        namespace["service_options"][service.name] = options_class
        for spec in options_class.option_specs():
            if spec.name in PROCESS_OPTION_NAMES:
                continue  # the product's own, not one service's
            method = _forwarder(service.name, spec)
            namespace["opt_" + (_prefix(service.name) + spec.name).replace("-", "_")] = method
            if spec.short and not _prefix(service.name):
                namespace["opt_" + spec.short] = method
    return type("Options", (_ProductOptions,), namespace)


Options = _product_options_class()


def compose(
    options: usage.Options | dict[str, Any],
    exit_on_failure: bool = False,
    reactor: Any = None,
) -> ProductService:
    """The product as one ProductService, from parsed :data:`Options` (tac files use it too)."""
    product = ProductService(exit_on_failure=exit_on_failure, reactor=reactor)
    composition = Composition()
    hold_cpu_latency(product, options)
    for name, sub in options["service-options"].items():
        build = importlib.import_module(entry(name).tap).build
        product.add(name, build(sub, composition), _prefix(name), sub)
    port = int(options["http-port"])
    if port:
        from bus.statusweb import StatusWebService

        services: list[tuple[str, Service]] = [(c.name, c.service) for c in product.composed]
        bus_options = options["service-options"].get("eventbus")
        bind = bus_options["bind"] if bus_options is not None else "127.0.0.1"

        def listening(address: str) -> None:
            composition.status_address = address

        web = StatusWebService(services, port, bind, reactor, on_listening=listening)
        product.add("http", web, "", options)
    return product


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """``twistd -n eventbus``: a service that cannot start ends the process, in one line."""
    return compose(options, exit_on_failure=True)
