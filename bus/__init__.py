"""bus: Twisted servers for ZeroMQ protocols (Event BUS, eMQP, mc0, DBP, ZRE) and a Spark bridge."""

#: The release, written here only: setup.cfg reads it (``attr:``, without importing bus),
#: ``--version``, ``/status`` and ``bus_build_info`` show it.
__version__ = "0.1.1"


def version_line(program: str) -> str:
    """What ``PROGRAM --version`` prints: ``eventbus-cli (bus) 0.1.1``."""
    return f"{program} (bus) {__version__}"
