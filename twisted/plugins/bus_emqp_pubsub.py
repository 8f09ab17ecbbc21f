# Names the ServiceMaker only; bus.emqp.pubsub_tap loads when the command runs.
from twisted.application.service import ServiceMaker

emqp_pubsub = ServiceMaker(
    "eMQP PUBLISH service",
    "bus.emqp.pubsub_tap",
    "eventmq's PUBLISH service (emq-pubsub): PUBLISH from publishers out to SUB subscribers",
    "emqp-pubsub",
)
