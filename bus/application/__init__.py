"""The product's service machinery, below the protocols: the options every service's tap
builds on (:mod:`bus.application.options`), composing services into one process
(:mod:`bus.application.composition`), the registry of services built in and declared by
other distributions (:mod:`bus.application.services`), what a service tells the system
(:mod:`bus.application.activity`, :mod:`bus.application.statusjson`) and what it may offer
operators (:mod:`bus.application.contract`).

The whole product's twistd plugin, which composes every protocol, is :mod:`bus.tap`;
third-party services import from :mod:`bus.extension`.
"""
