# Names the ServiceMaker only; bus.mc0.tap (and txzmq, with the reactor) load when the command runs.
from twisted.application.service import ServiceMaker

mc0 = ServiceMaker(
    "mc0",
    "bus.mc0.tap",
    "mc0 broker: CURVE-secured topic pub/sub (Marionette Collective 0MQ v0.3)",
    "mc0",
)
