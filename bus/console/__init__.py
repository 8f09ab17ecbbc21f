"""The operator's console: a page at ``/`` on the HTTP port, live, and the JSON and
stream API it is built on (documented for scripts too, in docs/operations.md).

* :mod:`.view`: what the console shows of every composed service, lists bounded;
* :mod:`.history`: rates per second of the last minutes, sampled only while watched;
* :mod:`.stream`: Server-Sent Events to open consoles, with TCP back-pressure;
* :mod:`.tail`: a bounded live tail of an Event BUS subtree, over the bus's PUB port;
* :mod:`.api`: the twisted.web resources, and the page itself (package data).
"""
