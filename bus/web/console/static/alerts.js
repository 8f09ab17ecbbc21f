// The alerts: the shipped rules (docs/prometheus/alerts.yml) evaluated in the product over
// its own samples, as each state frame carries them (`alerts`; /api/v1/alerts for scripts,
// shaped as Prometheus's): listed with since when, and each service's card framed by its
// own (red: one firing, amber: one pending) with a line per alert.
"use strict";

function alertSince(alert, now) {
  const since = Date.parse(alert.activeAt) / 1000;
  return new Date(since * 1000).toLocaleTimeString() + " (" + duration(now - since) + " ago)";
}

function drawAlerts(state) {
  const alerts = state.alerts;
  if (!alerts) return;  // a server without the alert engine
  const now = state.t || state.time;
  $("alerts-view").hidden = false;
  const firing = alerts.filter((a) => a.state === "firing").length;
  $("alerts-count").textContent = firing + " firing, " + (alerts.length - firing) + " pending";
  rows("alerts-rows", alerts, (a) => el("tr",
    {"data-alert": a.labels.alertname, "data-state": a.state, class: a.state === "firing" ? "bad" : "warn"},
    ...cells(a.state, a.labels.alertname, a.labels.severity || "", a.service || "",
             a.annotations.summary || "", alertSince(a, now))), "no alert pending or firing");
  for (const a of alerts) {
    const node = a.service && $("card-" + a.service);
    if (!node) continue;
    if (a.state === "firing") node.classList.remove("alert-pending");
    if (!node.classList.contains("alert-firing")) node.classList.add("alert-" + a.state);
    node.append(el("div", {class: "line alert " + (a.state === "firing" ? "alarm" : "caution")},
      a.labels.alertname + " " + a.state + " since " + alertSince(a, now)));
  }
}
