"""bus: Twisted servers for ZeroMQ protocols (Event BUS, eMQP, mc0, DBP, ZRE) and a Spark bridge."""

__version__ = "0.1.0"
