"""DBP, the Core Catalog Service (spec 003): services register and heartbeat, clients ask which
services exist, a UDP beacon says where the catalog is.

Importing this package is cheap and reactor-free; the server and client modules import the
ZeroMQ transport when they are themselves imported.
"""
