"""The Event BUS (spec 000): Clone-pattern pub/sub with snapshot, publisher and collector ports.

Importing this package is cheap and reactor-free; the server and client modules import
the ZeroMQ transport when they are themselves imported.
"""
