"""ZRE (specs 20/ZRE and 36/ZRE): peers on a network discover each other by UDP beacon,
greet each other over ZeroMQ and send WHISPERs to one peer and SHOUTs to a group.

Importing this package is cheap and reactor-free; :mod:`bus.zre.node` imports the transport.
"""
