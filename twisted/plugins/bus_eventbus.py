# A plugin file only names its ServiceMaker: bus.tap is imported when the command runs,
# after twistd has installed the reactor (importing txzmq earlier would install the default).
from twisted.application.service import ServiceMaker

eventbus = ServiceMaker(
    "Event BUS",
    "bus.tap",
    "Event BUS server (snapshot, publisher and collector ports) with a durable log",
    "eventbus",
)
