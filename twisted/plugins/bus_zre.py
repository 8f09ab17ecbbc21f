# Names the ServiceMaker only; bus.zre.tap loads when the command runs.
from twisted.application.service import ServiceMaker

zre = ServiceMaker(
    "ZRE node",
    "bus.zre.tap",
    "A ZRE node (36/ZRE, or 20/ZRE with --version 1): beacons, groups, WHISPER and SHOUT",
    "zre",
)
