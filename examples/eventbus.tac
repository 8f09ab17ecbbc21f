# Run with:  twistd -ny examples/eventbus.tac
# The same makeService() as `twistd -n eventbus`; settings come from EVENTBUS_* variables
# (e.g. EVENTBUS_PORT=6000 EVENTBUS_DATA_DIR=/var/lib/eventbus) or the defaults.
from twisted.application.service import Application

from bus.tap import Options, makeService

options = Options()
options.parseOptions([])  # defaults and EVENTBUS_* environment variables

application = Application("eventbus")
makeService(options).setServiceParent(application)
