# Names the ServiceMaker only; bus.emqp.tap loads when the command runs.
from twisted.application.service import ServiceMaker

emqp = ServiceMaker(
    "eMQP broker",
    "bus.emqp.tap",
    "A job broker for EventMQ workers and clients, with replies, guarantees and retries",
    "emqp",
)
