# Run with:  twistd -ny examples/eventbus.tac
# The same options and the same function as `twistd -n eventbus`: settings come from
# EVENTBUS_* variables (EVENTBUS_PORT=6000, EVENTBUS_SERVICES=eventbus,spark-bridge,
# SPARK_BRIDGE_JOURNAL_DIR=...), from the file EVENTBUS_CONFIG names (see bus.toml), or defaults.
from twisted.application.service import Application

from bus.tap import Options, makeService

options = Options()
options.parseOptions([])

application = Application("eventbus")
makeService(options).setServiceParent(application)
