"""The optional extras (``pip install "bus[spark]"``, ``[cluster]``, ``[redis]``): what needs
one asks for it through :func:`require` where its options are read, before anything starts,
so that a missing extra is one line naming the extra and the pip command, never an
ImportError's traceback at start or at connect time.

:class:`MissingExtra` is a :class:`bus.errors.StartupError`: the product reports it as it
reports a busy port (``cannot start spark-bridge: --spark-bridge-journal-dir DIR: ...``), and
a command-line tool prints it as its one line. No Twisted here: Spark's executors import
:mod:`bus.nats`, which asks for ``nkeys`` through this module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from bus.errors import StartupError


class MissingExtra(StartupError):
    """``what`` needs ``needed`` (a package or a program), which the ``extra`` extra installs.

    ``option``: the option that asked for it (``nats-creds``), empty when the service or the
    command needs it whatever its options say. ``problem``: why an installed module did not
    import (empty when it is not installed)."""

    def __init__(
        self, needed: str, extra: str, what: str, option: str = "", problem: str = ""
    ) -> None:
        self.needed = needed
        self.extra = extra
        self.what = what
        why = f"which does not import ({problem})" if problem else "which is not installed"
        super().__init__(option, f"{what} needs {needed}, {why}: {install_command(extra)}")


def install_command(extra: str) -> str:
    """``pip install "bus[EXTRA]"`` (quoted for a shell)."""
    return f'pip install "bus[{extra}]"'


def require(module: str, extra: str, what: str, option: str = "", package: str = "") -> ModuleType:
    """``module`` imported, or :class:`MissingExtra` naming ``package`` (default: the module)
    and the ``extra`` that installs it. ``what`` needs it, and says so in the error: "the
    bridge's Parquet journal", "a NATS credentials file"."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.partition(".")[0]
        absent = error.name is not None and error.name.partition(".")[0] == top
        problem = "" if absent else f"{type(error).__name__}: {error}"
        raise MissingExtra(package or top, extra, what, option, problem) from None


def require_tls(what: str, option: str = "") -> None:
    """Twisted's TLS, which ``twisted[tls]`` brings (pyOpenSSL, service-identity): the
    ``cluster`` extra installs it for TLS to NATS servers."""
    require("OpenSSL", "cluster", what, option, package="pyOpenSSL")
    require("service_identity", "cluster", what, option, package="service-identity")
