"""Socket layer shared by the protocol services.

``bus.transport.zmqsocket`` imports txzmq (and so the global reactor): import it
only from service code, never at plugin-discovery time.
"""
