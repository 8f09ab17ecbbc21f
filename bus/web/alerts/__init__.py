"""Alerts: the shipped rules defined once (:mod:`bus.web.alerts.rules`), their conditions as
PromQL and as an evaluator (:mod:`bus.web.alerts.expr`), and the console's evaluation of
them over the product's own samples, pending then firing (:mod:`bus.web.alerts.engine`)."""
