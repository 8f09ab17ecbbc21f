"""The HTTP port: ``/status`` and ``/metrics`` (:mod:`bus.web.server`), the bearer token
that guards it (:mod:`bus.web.auth`), the channel that bounds what a peer may send
(:mod:`bus.web.channel`), the operator's console (:mod:`bus.web.console`) and the shipped
alert rules, defined once and evaluated in the process for it (:mod:`bus.web.alerts`)."""
