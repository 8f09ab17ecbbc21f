"""mc0 (spec 002, Marionette Collective 0MQ v0.3): CURVE-secured topic middleware.

Importing this package is cheap and reactor-free; the server and client modules import
the ZeroMQ transport when they are themselves imported.
"""
