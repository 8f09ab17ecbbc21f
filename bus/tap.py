"""``twistd -n eventbus``: the whole product, one :class:`bus.application.composition.ProductService`
holding a service per protocol, plus ``/status`` and ``/metrics`` over HTTP.

``--services`` chooses the services (default: every protocol). The Event BUS's own options are
the product's, without a prefix (``--port``); every other service's options are offered with
its name as prefix (``--spark-bridge-journal-dir``), derived from that service's own
``Options`` (:mod:`bus.application.services` lists them), so each is written once. Precedence, for every
option of every service: command line > environment > ``--config`` file > default.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.python import usage

from bus.application.composition import bound_inbound, hold_cpu_latency
from bus.application.options import PROCESS_OPTION_NAMES, OptionSpec
from bus.application.services import ServiceEntry, discovery_problems, entry, services
from bus.eventbus.tap import Options as EventBusOptions
from bus.extension import Composition, ProductService, ServiceOptions, StartFailed, StartupError
from bus.util.values import parse_duration

if TYPE_CHECKING:
    from twisted.application.service import Service

DEFAULT_HTTP_PORT = 8642


def default_services() -> tuple[str, ...]:
    """The services ``--services`` names unless told otherwise."""
    return tuple(service.name for service in services() if service.default)


@functools.cache
def loaded() -> tuple[dict[str, type[ServiceOptions]], tuple[str, ...], dict[str, str]]:
    """:func:`_load_services`, once, when the product's options are first needed: importing
    this module reads no entry point and imports no third-party tap."""
    return _load_services()


def service_order() -> tuple[str, ...]:
    """Every service's name, in start order."""
    return loaded()[1]


def service_problems() -> tuple[str, ...]:
    """One line per third-party service that could not join, for --help and the log."""
    return (*discovery_problems(), *loaded()[2].values())


def _load_services() -> tuple[dict[str, type[ServiceOptions]], tuple[str, ...], dict[str, str]]:
    """Each service's Options class, the names in start order, and why a declared (third-
    party) service was left out: one line each, naming its distribution, never a traceback.
    Every tap names the services it must start after in ``AFTER`` (the built-in ones that
    publish their activity onto the local bus name ``eventbus``); otherwise the built-in
    services come first, in their order, and declared ones follow."""
    options: dict[str, type[ServiceOptions]] = {}
    left_out: dict[str, str] = {}
    after: dict[str, tuple[str, ...]] = {}
    for service in services():
        if not service.distribution:
            module = importlib.import_module(service.tap)
            options[service.name] = module.Options
            after[service.name] = tuple(getattr(module, "AFTER", ()))
            continue
        try:
            options[service.name], after[service.name] = _declared_tap(service)
        except Exception as error:  # anything a third-party module may raise on import
            left_out[service.name] = (
                f"service {service.name!r} of {service.distribution} left out: "
                f"{type(error).__name__}: {error}"
            )
    order: list[str] = []
    pending = [s.name for s in services() if s.name in after]
    while pending:
        ready = [n for n in pending if all(d in order or d not in pending for d in after[n])]
        if not ready:  # a cycle: say so, start them by name
            for name in pending:
                left_out[name] = f"service {name!r}: AFTER makes a cycle with {', '.join(pending)}"
                options.pop(name, None)
            break
        order.append(ready[0])  # the first ready one in the listed order: a stable order
        pending.remove(ready[0])
    return options, tuple(order), left_out


def _declared_tap(service: ServiceEntry) -> tuple[type[ServiceOptions], tuple[str, ...]]:
    module = importlib.import_module(service.tap)
    options_class = getattr(module, "Options", None)
    if not (isinstance(options_class, type) and issubclass(options_class, ServiceOptions)):
        raise TypeError(
            f"{service.tap}.Options is not a bus.application.options.ServiceOptions subclass"
        )
    if not callable(getattr(module, "build", None)):
        raise TypeError(f"{service.tap} has no build(options, composition)")
    options_class.option_specs()  # a malformed options table fails here, not in --help
    after = tuple(str(name) for name in getattr(module, "AFTER", ()))
    return options_class, after


def service_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """``eventbus,spark-bridge`` (or a TOML list) -> names, checked, in start order."""
    names = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
    chosen = {str(name) for name in names if str(name)}
    _, order, left_out = loaded()
    for name in sorted(chosen - set(order)):
        if name in left_out:
            raise usage.UsageError(f"--services: {left_out[name]}")
        raise usage.UsageError(f"--services: no service named {name!r}; valid: {', '.join(order)}")
    if not chosen:
        raise usage.UsageError(f"--services: name at least one of {', '.join(order)}")
    return tuple(name for name in order if name in chosen)


def _prefix(service: str) -> str:
    """How a service's options are spelled in the product: the Event BUS's bare."""
    return "" if service == "eventbus" else f"{service}-"


def _trusted_proxies(value: str) -> str:
    from bus.web.channel import TrustedProxies

    TrustedProxies.parse(value)  # checked now, used at composition
    return value


_trusted_proxies.wants = "addresses or networks, comma-separated (127.0.0.1,10.0.0.0/8)"  # type: ignore[attr-defined]


def _alert_for(value: str) -> str:
    from bus.web.alerts.engine import parse_for

    try:
        parse_for(value)  # checked now, used at composition
    except ValueError as error:
        raise usage.UsageError(f"--http-alert-for: {error}") from None
    return value


_alert_for.wants = "NAME=DURATION pairs, comma-separated (*=2s,EmqpQueueWithoutWorkers=10s)"  # type: ignore[attr-defined]


def _forwarded_header(value: str) -> str:
    from bus.web.channel import FORWARDED_HEADERS

    header = value.strip().lower()
    if header not in FORWARDED_HEADERS:
        raise ValueError(value)
    return header


_forwarded_header.wants = "x-forwarded-for or forwarded"  # type: ignore[attr-defined]


def _positive_duration(value: str | float) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(value)
    return seconds


_positive_duration.wants = "a duration above zero (10s, 500ms)"  # type: ignore[attr-defined]


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
        [
            "http-metrics-open",
            None,
            "With --http-token-file: leave /metrics open (a Prometheus without the token).",
        ],
    ]
    optParameters = [
        [
            "http-port",
            None,
            DEFAULT_HTTP_PORT,
            "Port of /status and /metrics (0: off).",
            int,
        ],
        [
            "http-bind",
            None,
            "127.0.0.1",
            "Address of the HTTP port; beyond loopback, give --http-token-file.",
        ],
        [
            "http-token-file",
            None,
            None,
            "File of a bearer token every HTTP request must carry (Authorization: Bearer "
            "TOKEN); re-read when it changes.",
        ],
        [
            "http-trusted-proxy",
            None,
            None,
            "Reverse proxies in front of the HTTP port (addresses or networks, "
            "comma-separated) whose --http-forwarded-header names the client: the per-address "
            "bounds then apply to that client, not to the proxy.",
            _trusted_proxies,
        ],
        [
            "http-forwarded-header",
            None,
            "x-forwarded-for",
            "The header the trusted proxies name the client in: x-forwarded-for or forwarded "
            "(RFC 7239); the other is never read.",
            _forwarded_header,
        ],
        [
            "http-history-dir",
            None,
            None,
            "Directory of the console's rates kept on disk (default: console-history in the "
            "Event BUS's --data-dir, else in the first composed service's; none: not kept).",
        ],
        [
            "http-history-interval",
            None,
            "10s",
            "How often the console's rates are written to its history (one sample per series).",
            _positive_duration,
        ],
        [
            "http-history-keep",
            None,
            "24h",
            "How long the console's history reaches back (its files' size follows; 0: none kept).",
            parse_duration,
        ],
        [
            "http-alert-for",
            None,
            None,
            "The console's alerts (the shipped rules, evaluated in the process): each named "
            "rule's `for` replaced, NAME=DURATION comma-separated, * for every rule "
            "(*=2s). For tests and drills; the shipped rules keep theirs.",
            _alert_for,
        ],
        ["journal-dir", None, None, "Same as --spark-bridge-journal-dir."],
    ]
    #: service -> Options class, for the options offered with its prefix.
    service_options: dict[str, type[ServiceOptions]] = {}

    def __init__(self) -> None:
        ServiceOptions.__init__(self)
        self.forwarded: dict[str, list[str]] = {name: [] for name in service_order()}
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
        prefixes = ", ".join(f"--{_prefix(name)}..." for name in service_order() if _prefix(name))
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
        self["services"] = tuple(name for name in service_order() if name in chosen)
        parsed: dict[str, ServiceOptions] = {}
        for name in self["services"]:
            sub = self.service_options[name]()
            try:
                ServiceOptions.apply_defaults(
                    sub,
                    self._tables,
                    os.environ,
                    self._path,
                    also_known=product_option_names(),
                )
                sub.parse_command_line(self.forwarded[name])
            except usage.UsageError as error:
                message = str(error)
                if _prefix(name):
                    message = message.replace("--", f"--{_prefix(name)}")
                raise usage.UsageError(message) from None
            except StartupError as error:  # what its options ask for is missing (bus.util.extras)
                line = error.line(name, _prefix(name), sub.get(error.option))
                raise StartFailed(line) from None
            for option in PROCESS_OPTION_NAMES:
                if sub.get(option) is not None:  # from its table or its environment
                    raise usage.UsageError(
                        f"{option} is an option of the whole process, not of {name}: set it "
                        f"as --{option}, EVENTBUS_{option.upper().replace('-', '_')} or in the "
                        "[eventbus] table"
                    )
            parsed[name] = sub
        self["service-options"] = parsed


@functools.cache
def product_option_names() -> frozenset[str]:
    """The product's own option names (not forwarded to a service)."""
    return frozenset(spec.name for spec in options_class().option_specs())


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


@functools.cache
def options_class() -> type[_ProductOptions]:
    """The product's Options: its own, plus each service's, by one mechanism (made when
    first asked for; ``bus.tap.Options`` is it)."""
    service_options, order, _ = loaded()
    namespace: dict[str, Any] = {
        "service_options": dict(service_options),
        "optParameters": [
            [
                "services",
                None,
                ",".join(default_services()),
                f"Services to run, comma-separated, of: {', '.join(order)}.",
                service_list,
            ]
        ],
    }
    for name in order:
        for spec in service_options[name].option_specs():
            if spec.name in PROCESS_OPTION_NAMES:
                continue  # the product's own, not one service's
            method = _forwarder(name, spec)
            attribute = "opt_" + (_prefix(name) + spec.name).replace("-", "_")
            if attribute in namespace:
                continue  # e.g. a declared service "x" with --y beside one "x-y": first wins
            namespace[attribute] = method
            if spec.short and not _prefix(name):
                namespace["opt_" + spec.short] = method
    problems = service_problems()
    if problems:
        namespace["longdesc"] = (
            _ProductOptions.longdesc + " Not available: " + "; ".join(problems) + "."
        )
        for line in problems:
            sys.stderr.write(f"eventbus: {line}\n")
    return type("Options", (_ProductOptions,), namespace)


def __getattr__(name: str) -> Any:
    """``Options`` (what twistd reads of this plugin's module) and the former constants,
    made when first asked for."""
    lazy: dict[str, Callable[[], Any]] = {
        "Options": options_class,
        "DEFAULT_SERVICES": default_services,
        "SERVICE_ORDER": service_order,
        "SERVICE_OPTIONS": lambda: loaded()[0],
        "LEFT_OUT": lambda: loaded()[2],
        "SERVICE_PROBLEMS": service_problems,
        "PRODUCT_OPTION_NAMES": product_option_names,
    }
    if name in lazy:
        return lazy[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def compose(
    options: usage.Options | dict[str, Any],
    exit_on_failure: bool = False,
    reactor: Any = None,
) -> ProductService:
    """The product as one ProductService, from parsed options (:func:`options_class`; tac
    files use it too)."""
    product = ProductService(exit_on_failure=exit_on_failure, reactor=reactor)
    composition = Composition(reactor)
    hold_cpu_latency(product, options)
    bound_inbound(product, options)
    for name, sub in options["service-options"].items():
        build = importlib.import_module(entry(name).tap).build
        product.add(name, build(sub, composition), _prefix(name), sub)
    port = int(options["http-port"])
    if port:
        from bus.web.server import StatusWebService

        services: list[tuple[str, Service]] = [(c.name, c.service) for c in product.composed]

        def listening(address: str) -> None:
            composition.status_address = address

        def tail_source() -> Any:
            return composition.local_bus  # the console's topic tail watches this bus

        from bus.web.channel import TrustedProxies

        token = options.get("http-token-file")
        proxies = TrustedProxies.parse(
            options.get("http-trusted-proxy"),
            options.get("http-forwarded-header") or "x-forwarded-for",
        )
        web = StatusWebService(
            services,
            port,
            options.get("http-bind") or "127.0.0.1",
            reactor,
            on_listening=listening,
            token_file=Path(token) if token else None,
            metrics_open=bool(options.get("http-metrics-open")),
            tail_source=tail_source,
            trusted_proxies=proxies,
            **_history(options),
            alert_for=_hold(options.get("http-alert-for")),
        )
        services.append(("http", web))  # its refusals in /status and /metrics too
        product.add("http", web, "", options)
    return product


def _history(options: usage.Options | dict[str, Any]) -> dict[str, Any]:
    """Where and how the console's rates are kept (see :mod:`bus.web.history`)."""
    keep = parse_duration(options.get("http-history-keep", 86400.0))
    if keep <= 0:
        return {"history_dir": None}
    directory = options.get("http-history-dir")
    if not directory:
        # The first data directory of the services composed (the Event BUS's first): never
        # the working directory, which several processes may share.
        kept = [
            sub["data-dir"]
            for _, sub in sorted(
                options["service-options"].items(), key=lambda item: item[0] != "eventbus"
            )
            if sub.get("data-dir")
        ]
        if not kept:
            return {"history_dir": None}
        directory = Path(kept[0]) / "console-history"
    return {
        "history_dir": Path(directory),
        "history_interval": _positive_duration(options.get("http-history-interval", 10.0)),
        "history_keep": keep,
    }


def _hold(text: str | None) -> Any:
    """The alerts' ``for`` of ``--http-alert-for`` (None: the rules' own)."""
    if not text:
        return None
    from bus.web.alerts.engine import parse_for

    return parse_for(text)


def makeService(options: usage.Options | dict[str, Any]) -> ProductService:
    """``twistd -n eventbus``: a service that cannot start ends the process, in one line."""
    return compose(options, exit_on_failure=True)
