"""The operator's console: a page at ``/`` on the HTTP port, live, and the JSON and
stream API it is built on (documented for scripts too, in docs/operations.md).

* :mod:`bus.web.console.view`: what the console shows of every composed service, lists bounded;
* :mod:`bus.web.console.history`: rates per second of the last minutes, sampled only while watched;
* :mod:`bus.web.console.stream`: Server-Sent Events to open consoles, with TCP back-pressure;
* :mod:`bus.web.console.tail`: a bounded live tail of an Event BUS subtree, watching its broadcast;
* :mod:`bus.web.console.api`: the twisted.web resources, and the page itself (package data).
"""
