"""Command-line options shared by every service's tap: durations, and one precedence rule.

Each service (plugin) has a :class:`ServiceOptions` subclass. An option's value comes from,
strongest first: the command line, the environment (``<ENV_PREFIX>_<OPTION>``, upper case,
dashes as underscores), the ``--config`` TOML file (the table named after the service, keys
spelled as the options), then the option's default. The same rule holds whether a plugin runs
alone (``twistd -n spark-bridge``) or composed into ``twistd -n eventbus``.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from twisted.python import reflect, usage

from bus import version_line
from bus.application.services import service_names
from bus.errors import StartFailed, StartupError
from bus.util.values import parse_bool

ConfigTables = Mapping[str, Mapping[str, Any]]


def load_config_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The tables of a TOML config file, with a usage error naming the file when it is
    missing or malformed."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise usage.UsageError(f"--config {path}: no such file") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise usage.UsageError(f"--config {path}: {error}") from None
    tables: dict[str, dict[str, Any]] = {}
    for name, table in document.items():
        if not isinstance(table, dict):
            raise usage.UsageError(
                f"--config {path}: {name!r} is not a table; write [{name}] then its options"
            )
        tables[name] = table
    return tables


def config_path_in(args: Sequence[str]) -> str | None:
    """The ``--config`` value in a command line, wherever it stands."""
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--config" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--config="):
            return arg.partition("=")[2]
    return None


def connection_count(text: str | int) -> int:
    """A count of connections: a whole number, 0 or more (0: the default)."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise ValueError(f"wants a whole number, 0 or more, not {text!r}")
    return value


connection_count.coerceDoc = "A whole number, 0 or more."  # type: ignore[attr-defined]


def microseconds(text: str) -> int:
    """A whole number of microseconds, 0 or more; ValueError otherwise."""
    value = int(text)
    if value < 0:
        raise ValueError(microseconds.wants)  # type: ignore[attr-defined]
    return value


#: What the option wants, for the usage error (see :func:`_named_coercion`).
microseconds.wants = "a number of microseconds, 0 or more"  # type: ignore[attr-defined]


class OptionSpec:
    """One option of a :class:`ServiceOptions` class, as composition sees it."""

    __slots__ = ("coerce", "default", "doc", "kind", "name", "short")

    def __init__(
        self,
        kind: str,
        name: str,
        short: str | None,
        default: Any,
        doc: str,
        coerce: Callable[[Any], Any] | None = None,
    ) -> None:
        self.kind = kind  # "parameter", "flag" or "multi"
        self.name = name
        self.short = short
        self.default = default
        self.doc = doc
        self.coerce = coerce


class ServiceOptions(usage.Options):
    """twistd options of one service, with environment and config-file defaults.

    Subclasses set :attr:`service` and :attr:`env_prefix` and declare ``optParameters``,
    ``optFlags`` and ``optMulti`` (repeatable options collected into a list); they validate
    and build their settings in ``postOptions`` as usual.
    """

    #: The plugin's name: its table in a config file, its prefix when composed.
    service: ClassVar[str] = ""
    #: Environment variables are ``<env_prefix>_<OPTION>``.
    env_prefix: ClassVar[str] = ""
    optFlags: ClassVar[list[list[Any]]] = []
    #: Repeatable options: ``[name, short, doc]``; the value is a list.
    optMulti: ClassVar[list[list[Any]]] = []
    #: Tables a config file may hold beyond one per service the product knows.
    extra_tables: ClassVar[frozenset[str]] = frozenset()
    #: Options of the whole process, inherited by every subclass (Twisted gathers
    #: ``optParameters`` along the classes): taken by the product and by a plugin run alone
    #: (``twistd -n emqp``), never handed to one service inside the product.
    optParameters: ClassVar[list[list[Any]]] = [
        [
            "cpu-latency-us",
            None,
            None,
            "Hold the CPUs' wake-up latency at most this many microseconds while running "
            "(Linux PM QoS through /dev/cpu_dma_latency; 0 keeps idle CPUs polling): shorter "
            "round trips for more power and CPU. Needs write access to that file. Off by default.",
            microseconds,
        ],
        [
            "max-connections",
            None,
            None,
            "Most connections others may hold open on each ZeroMQ port; those beyond are closed "
            "as soon as accepted (0: half of the descriptors inbound connections may take, "
            "which is half of the process's limit).",
            connection_count,
        ],
        [
            "max-connections-per-address",
            None,
            None,
            "Most connections one peer address may hold open on each ZeroMQ port (0: a quarter "
            "of --max-connections, at least 64).",
            connection_count,
        ],
    ]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "optParameters" in cls.__dict__:
            cls.optParameters = [_named_coercion(entry) for entry in cls.optParameters]
        for name, _short, doc in cls.optMulti:
            attribute = "opt_" + name.replace("-", "_")
            if attribute not in cls.__dict__:
                setattr(cls, attribute, _multi_handler(name, doc))

    def __init__(self) -> None:
        usage.Options.__init__(self)
        for name, _short, _doc in self.optMulti:
            self[name] = []
        self["config"] = None
        self._set_on_command_line: set[str] = set()
        #: Config-table keys that belong to the process composing this service (the
        #: product's own options), set by :meth:`apply_defaults`.
        self.also_known: frozenset[str] = frozenset()
        #: Option -> where its value came from, for those set by the config file or the
        #: environment (:meth:`apply_defaults`).
        self.sources: dict[str, str] = {}

    def opt_version(self) -> NoReturn:
        """Print the version of bus and exit."""
        program = f"twistd {self.service}" if self.parent is not None else self.service
        print(version_line(program))
        raise SystemExit(0)

    def opt_config(self, path: str) -> None:
        """TOML file, a table per service ([eventbus], [spark-bridge]); environment and command line win."""
        self["config"] = path

    # -- where values come from --------------------------------------------------------------

    @classmethod
    def option_specs(cls) -> list[OptionSpec]:
        """Every option of this class, the process's (:data:`PROCESS_OPTION_NAMES`) included."""
        specs = []
        parameters: list[list[Any]] = []
        reflect.accumulateClassList(cls, "optParameters", parameters)
        for entry in parameters:
            name, short, default, doc, *rest = entry
            specs.append(OptionSpec("parameter", name, short, default, doc, *rest[:1]))
        for name, short, doc in getattr(cls, "optFlags", []):
            specs.append(OptionSpec("flag", name, short, False, doc))
        for name, short, doc in cls.optMulti:
            specs.append(OptionSpec("multi", name, short, [], doc))
        return specs

    def parse_layered(self, options: Sequence[str] | None = None) -> None:
        """Config file, then environment, then ``options`` (default: ``sys.argv[1:]``)."""
        import sys

        args = list(sys.argv[1:] if options is None else options)
        path = config_path_in(args) or os.environ.get(f"{self.env_prefix}_CONFIG") or None
        tables = load_config_file(path) if path else {}
        if path:
            self["config"] = path
        self.apply_defaults(tables, os.environ, path or "")
        self.parse_command_line(args)

    def parse_command_line(self, args: Sequence[str]) -> None:
        """Parse ``args`` over the defaults already applied; an unknown option's error names
        the nearest valid ones."""
        try:
            usage.Options.parseOptions(self, list(args))
        except usage.UsageError as error:
            raise usage.UsageError(self.explain(str(error))) from None

    def parseOptions(self, options: Sequence[str] | None = None) -> None:
        """Parse the command line over the layered defaults; a usage error is one line, and
        so is what the options ask for that is not there (a missing extra, bus.util.extras)."""
        try:
            self.parse_layered(options)
        except usage.UsageError as error:
            if self.parent is None:
                raise
            # Under twistd: one line, not the whole --help above it.
            raise SystemExit(
                f"twistd {self.service}: {error}\n(twistd {self.service} --help lists its options)"
            ) from None
        except (StartupError, StartFailed) as error:
            if self.parent is None:
                raise
            # Status 1, as when a service cannot start; --help would not help.
            line = (
                error.line(self.service, "", self.get(error.option))
                if isinstance(error, StartupError)
                else str(error)
            )
            raise SystemExit(f"twistd {self.service}: {line}") from None

    def explain(self, message: str) -> str:
        """Twisted's usage error ``message``, reworded for operators (with the closest option)."""
        match = re.match(r"option (-\S+) not recognized", message)
        if match is None:
            return message.replace("Parameter type enforcement failed: ", "")
        given = match.group(1).lstrip("-")
        valid = sorted({name.rstrip("=") for name in self.longOpt})
        near = difflib.get_close_matches(given, valid, n=3, cutoff=0.6)
        hint = (
            f"did you mean {', '.join('--' + n for n in near)}?" if near else self.no_match_hint()
        )
        return f"unknown option --{given}; {hint}"

    def no_match_hint(self) -> str:
        """What to say when an unknown option is close to none of ours."""
        return f"{self.service or 'this command'} has no such option"

    def apply_defaults(
        self,
        tables: ConfigTables,
        environ: Mapping[str, str],
        path: str = "",
        also_known: Iterable[str] = (),
    ) -> None:
        """Take values from the config file's table, then from the environment (stronger).
        Keys of the table that are neither this service's options nor ``also_known`` are a
        usage error naming the valid ones. ``also_known`` is kept: a service that reads its
        options again (SIGHUP) knows the composing product's names without importing it."""
        self.also_known = frozenset(also_known)
        known_tables = frozenset(service_names()) | self.extra_tables
        unknown_tables = sorted(set(tables) - known_tables)
        if unknown_tables:
            raise usage.UsageError(
                f"--config {path}: unknown table [{unknown_tables[0]}]; "
                f"valid tables: {', '.join(sorted(known_tables))}"
            )
        specs = {spec.name: spec for spec in self.option_specs()}
        table = tables.get(self.service, {})
        unknown = sorted(set(table) - set(specs) - set(also_known) - {"config"})
        if unknown:
            raise usage.UsageError(
                f"--config {path}: [{self.service}] has no option {unknown[0]!r}; valid: "
                f"{', '.join(sorted(set(specs) | set(also_known)))}"
            )
        for name, spec in specs.items():
            if name in table:
                source = f"--config {path} [{self.service}]"
                self[name] = self._coerced(spec, table[name], source)
                self.sources[name] = source
            variable = f"{self.env_prefix}_{name.upper().replace('-', '_')}"
            if variable in environ:
                source = f"environment {variable}"
                self[name] = self._coerced(spec, environ[variable], source)
                self.sources[name] = source

    @staticmethod
    def _coerced(spec: OptionSpec, value: Any, source: str) -> Any:
        try:
            if spec.kind == "flag":
                return parse_bool(value)
            if spec.kind == "multi":
                if isinstance(value, str):
                    return [part.strip() for part in value.split(",") if part.strip()]
                if not isinstance(value, list):
                    raise usage.UsageError(f"expected a list, got {value!r}")
                return [str(part) for part in value]
            if spec.coerce is not None:
                return spec.coerce(value)
            return value if isinstance(value, str) else str(value)
        except (usage.UsageError, ValueError, TypeError) as error:
            raise usage.UsageError(f"{source}: {spec.name}: {error}") from None

    def set_from_command_line(self, name: str, value: Any) -> None:
        """A multi option's first use on the command line replaces file and environment values."""
        if name not in self._set_on_command_line:
            self._set_on_command_line.add(name)
            self[name] = []
        self[name].append(value)


class ValueHint(ValueError):
    """A coercion's refusal that says more than what the option wants (how to write it
    right): the usage error gives its text after the option's name."""


def _named_coercion(entry: list[Any]) -> list[Any]:
    """An optParameters entry whose coercion error names the option and the value."""
    if len(entry) < 5 or getattr(entry[4], "names_option", False):
        return entry
    name, coerce = entry[0], entry[4]

    def coerced(value: Any) -> Any:
        try:
            return coerce(value)
        except ValueHint as hint:
            raise ValueError(f"--{name}: {hint}") from None
        except (ValueError, TypeError):
            kind = "a whole number" if coerce is int else getattr(coerce, "wants", "a valid value")
            raise ValueError(f"--{name} wants {kind}, not {value!r}") from None

    coerced.names_option = True  # type: ignore[attr-defined]
    coerced.__name__ = getattr(coerce, "__name__", "coerce")
    coerced.coerceDoc = getattr(coerce, "coerceDoc", None)  # type: ignore[attr-defined]
    return [*entry[:4], coerced, *entry[5:]]


def _multi_handler(name: str, doc: str) -> Callable[[ServiceOptions, str], None]:
    def handler(self: ServiceOptions, value: str) -> None:
        self.set_from_command_line(name, value)

    handler.__doc__ = f"{doc} (repeatable)"
    return handler


ServiceOptions.optParameters = [_named_coercion(e) for e in ServiceOptions.optParameters]
#: The options of the whole process (see :attr:`ServiceOptions.optParameters`).
PROCESS_OPTION_NAMES = frozenset(entry[0] for entry in ServiceOptions.optParameters)
