# Names the ServiceMaker only; bus.emqp.worker_tap loads when the command runs.
from twisted.application.service import ServiceMaker

emqp_worker = ServiceMaker(
    "eMQP worker",
    "bus.emqp.worker_tap",
    "An eMQP worker that runs eventmq jobs and registered handlers in a process pool",
    "emqp-worker",
)
