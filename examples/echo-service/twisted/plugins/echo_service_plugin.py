# Names the ServiceMaker only: echo_service.tap is imported when the command runs.
from twisted.application.service import ServiceMaker

echo = ServiceMaker(
    "Echo", "echo_service.tap", "Echo service for the bus product (an example)", "echo"
)
