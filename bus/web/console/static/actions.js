// Operators' actions (POST /api/v1/actions/SERVICE/ACTION, docs/operations.md): buttons in the
// views' rows, shown when the server offers the action and wants a token (a port without one
// takes no action). The token goes in the Authorization header only, as for every read.
// A button that destroys something (purge, forget, remove) asks to be clicked again.
"use strict";

const ACTION_CONFIRM_MS = 5000;
const DESTRUCTIVE = new Set(["purge", "forget-worker", "remove-schedule", "drop-snapshot", "refuse"]);
let offeredActions = {};   // service -> [action, ...], as the HTTP port's status says
let armedAction = null;    // {key, until}: a destructive action clicked once

// Called with every state the stream brings, before the views are drawn.
function noteActions(state) {
  const http = (state.services || []).find((s) => s.name === "http");
  const status = (http && http.status) || {};
  offeredActions = status.token_required && status.actions ? status.actions.offered || {} : {};
  $("refuse-form").hidden = !offers("curve", "refuse");
}

// Loaded before console.js (whose helpers it calls once the page runs): the form is found
// by the document's own call.
document.getElementById("refuse-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = document.getElementById("refuse-key").value.trim();
  if (key) runAction("curve", "refuse", {key}, document.getElementById("refuse-button"));
});

function offers(service, action) {
  return (offeredActions[service] || []).includes(action);
}

function actionButton(service, action, params, label) {
  if (!offers(service, action)) return null;
  const key = service + "/" + action + "/" + JSON.stringify(params);
  const armed = armedAction && armedAction.key === key && armedAction.until > Date.now();
  const button = el("button", {type: "button", class: "act" + (armed ? " armed" : ""),
                               "data-action": action}, armed ? "confirm " + label : label);
  button.addEventListener("click", (event) => {
    event.stopPropagation();
    const now = armedAction && armedAction.key === key && armedAction.until > Date.now();
    if (DESTRUCTIVE.has(action) && !now) {
      armedAction = {key, until: Date.now() + ACTION_CONFIRM_MS};
      button.textContent = "confirm " + label;
      button.classList.add("armed");
      return;
    }
    armedAction = null;
    runAction(service, action, params, button);
  });
  return button;
}

// A cell of the buttons offered (empty when none is).
function actionCell(...buttons) {
  return el("td", {class: "actions"}, ...buttons.filter(Boolean));
}

async function runAction(service, action, params, button) {
  const line = $("action-result");
  if (button) button.disabled = true;
  line.className = "";
  line.textContent = service + " " + action + " " + JSON.stringify(params) + "…";
  try {
    const response = await fetch("/api/v1/actions/" + service + "/" + action, {
      method: "POST", cache: "no-store", body: JSON.stringify(params),
      headers: Object.assign({"Content-Type": "application/json"}, headers()),
    });
    let answer = {};
    try { answer = await response.json(); } catch (e) { /* not JSON */ }
    if (response.ok) {
      line.className = "good";
      line.textContent = service + " " + action + ": " + JSON.stringify(answer.result);
    } else {
      line.className = "bad";
      line.textContent = service + " " + action + " refused (HTTP " + response.status + "): " +
        (answer.message || answer.error || "");
    }
  } catch (error) {
    line.className = "bad";
    line.textContent = service + " " + action + ": cannot reach the server";
  } finally {
    if (button) button.disabled = false;
  }
}
