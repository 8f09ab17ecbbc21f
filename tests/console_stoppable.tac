# The product as examples/eventbus.tac composes it (EVENTBUS_* variables), plus one hook for
# the console's browser test: SIGUSR1 stops the composed service that STOP_ON_USR1 names,
# as a service that stops on its own would, and the process goes on.
import os
import signal

from twisted.application.service import Application
from twisted.internet import reactor

from bus.tap import Options, makeService

options = Options()
options.parseOptions([])
product = makeService(options)

application = Application("eventbus")
product.setServiceParent(application)


def _stop_named(*_: object) -> None:
    reactor.callFromThread(product.getServiceNamed(os.environ["STOP_ON_USR1"]).stopService)


reactor.callWhenRunning(signal.signal, signal.SIGUSR1, _stop_named)
