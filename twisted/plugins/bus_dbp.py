# Names the ServiceMaker only; bus.dbp.tap loads when the command runs.
from twisted.application.service import ServiceMaker

dbp = ServiceMaker(
    "DBP catalog",
    "bus.dbp.tap",
    "DBP Core Catalog Service: registrations, info requests, UDP heartbeats, SHALOM beacon",
    "dbp",
)
