// turnguard admin dashboard: polls the operator API and renders the live
// turns (with stall warnings and an abort button), the recent aborts and
// the stall history. The operator token comes from the URL fragment
// (#token=…), the tab's session storage or the form — never from the query
// (?token=…), which travels to the server and into logs, proxies and
// Referer headers; it is sent only as "Authorization: Bearer …" to this
// origin.
//
// Element ids, classes and data attributes are a contract with the
// end-to-end test (e2e/admin.mjs): #status[data-state], tr.turn[data-run-id]
// [data-stalled][data-state][data-class], .turn-class[data-class], .stall-warning, button.abort[data-run-id]
// [data-armed], #aborts tr.abort-row[data-run-id][data-stop-reason],
// #stalls tr.episode[data-run-id][data-outcome],
// #approvals tr.approval[data-approval-id], button.answer[data-option-id].
//
// Open questions (docs/approvals.md): each runner question nobody has
// answered yet is a row with one button per option; a click answers it as
// operator (POST /api/approvals/{id}), and its person sees "… by operator".
"use strict";

(() => {
  const TOKEN_KEY = "turnguard.operatorToken";
  const LIVE_EVERY = 1000; // ms between /api/turns polls
  const HISTORY_EVERY = 5000; // ms between stall history and diagnose polls
  const ARM_FOR = 4000; // ms an armed abort button waits for the confirming click

  const $ = (sel) => document.querySelector(sel);
  const el = (tag, props = {}, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "class") e.className = v;
      else if (k === "dataset") Object.assign(e.dataset, v);
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) if (c != null) e.append(c);
    return e;
  };

  let token = readToken();
  let authFailed = false;

  function readToken() {
    const t = new URLSearchParams(location.hash.slice(1)).get("token");
    if (t) {
      sessionStorage.setItem(TOKEN_KEY, t);
      history.replaceState(null, "", location.pathname); // keep the token out of the address bar and history
      return t;
    }
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  class AuthError extends Error {}

  async function api(path, opts = {}) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    if (opts.method === "POST") headers["Content-Type"] = "application/json";
    const res = await fetch(path, { ...opts, headers, cache: "no-store", credentials: "omit" });
    const body = await res.json().catch(() => ({}));
    // A refusal carries words for a person in `message` (the `error` is for API clients).
    if (res.status === 401 || res.status === 403) throw new AuthError(body.message || "This page needs the operator token.");
    if (!res.ok) throw new Error(body.error || `HTTP ${res.status}`);
    return body;
  }

  function setStatus(state, text) {
    const s = $("#status");
    s.dataset.state = state;
    s.textContent = text;
  }

  function showAuth(reason) {
    authFailed = true;
    setStatus("auth", "operator token needed");
    $("#auth-reason").textContent = reason;
    $("#auth").hidden = false;
    $("#token-input").focus();
  }

  $("#auth").addEventListener("submit", (e) => {
    e.preventDefault();
    token = $("#token-input").value.trim();
    $("#token-input").value = "";
    sessionStorage.setItem(TOKEN_KEY, token);
    $("#auth").hidden = true;
    authFailed = false;
    refreshAll();
  });

  // A token added to the address of the open dashboard ("#token=…") is
  // taken at once, without a reload.
  window.addEventListener("hashchange", () => {
    if (!new URLSearchParams(location.hash.slice(1)).get("token")) return;
    token = readToken();
    $("#auth").hidden = true;
    authFailed = false;
    refreshAll();
  });

  // Formatting.
  // dur writes a duration as the server's messages.FormatDuration does — as a
  // person writes it ("3.9 s", "45 s", "4 min 59 s", "about 12 min", "1 h 30 min"),
  // never Go's "1m05s"; negative (a deadline passed) with a minus sign. From a
  // second up (TestAdminPageDurationsMatchTheServer checks the two agree).
  function dur(ms) {
    if (ms == null) return "—";
    const neg = ms < 0;
    const s = Math.abs(ms) / 1000;
    let out;
    if (s < 9.95) out = Math.round(s * 10) / 10 + " s";
    else if (s < 59.5) out = Math.round(s) + " s";
    else if (s < 599.5) {
      const t = Math.round(s);
      out = Math.floor(t / 60) + " min" + (t % 60 ? " " + (t % 60) + " s" : "");
    } else {
      const m = Math.round(s / 60);
      out = (Math.abs(m * 60 - s) >= 1 ? "about " : "") +
        (m < 60 ? m + " min" : Math.floor(m / 60) + " h" + (m % 60 ? " " + (m % 60) + " min" : ""));
    }
    return neg ? "−" + out : out;
  }
  const time = (iso) => (iso ? new Date(iso).toLocaleString() : "—");
  const stepLabel = (s) => (s ? s.name || s.kind : "");
  const short = (id) => (id.length > 14 ? id.slice(0, 12) + "…" : id);

  // Live turns.
  const armed = new Map(); // runId → timer of an armed abort button

  function deadline(label, ms) {
    if (ms == null) return null;
    const cls = ms < 0 ? "deadline passed" : ms < 10000 ? "deadline near" : "deadline";
    return el("span", { class: cls, text: `${label} ${dur(ms)}` });
  }

  function renderTurns(data) {
    const body = $("#turns tbody");
    body.replaceChildren(...data.turns.map(turnRow));
    $("#live-count").textContent = String(data.count);
    const st = $("#stalled-count");
    st.hidden = data.stalled === 0;
    st.textContent = `${data.stalled} stalled`;
    // The stall classes (working, long-running, stalled, stuck) of the
    // scheduler's own decision, with the turns in each.
    const cl = $("#class-counts");
    if (cl) {
      const c = data.classes || {};
      cl.replaceChildren(...CLASSES.filter(([k]) => c[k] > 0).map(([k, label]) =>
        el("span", { class: `count class-${k}`, dataset: { class: k }, text: `${c[k]} ${label}` })));
    }
    $("#no-turns").hidden = data.count > 0;
  }

  // CLASSES are the stall classes of /api/turns (TurnView.class), in order,
  // with the words the dashboard shows.
  const CLASSES = [["working", "working"], ["long_running", "long-running"], ["stalled", "stalled"], ["stuck", "stuck"]];
  const CLASS_TITLES = {
    working: "Working: steps are completing",
    long_running: "Long-running: one step runs long, but it heartbeats",
    stalled: "Stalled: no heartbeat lately; it is still inside its no-progress window",
    stuck: "Stuck: past its deadline, and its runner has not stopped",
  };

  function turnRow(t) {
    const step = t.currentStep;
    const stepCell = el("td", {},
      step ? el("span", { class: "mono", text: `${stepLabel(step)} · ${dur(step.elapsedMs)}` }) : el("span", { class: "sub", text: "between steps" }),
      t.lastStep ? el("span", { class: "sub", text: `last: ${stepLabel(t.lastStep)}` }) : null,
      t.class ? el("span", { class: `turn-class class-${t.class}`, dataset: { class: t.class }, title: CLASS_TITLES[t.class] || "",
        text: (CLASSES.find(([k]) => k === t.class) || [t.class, t.class])[1] }) : null,
      t.stalled ? el("span", { class: "stall-warning", text: `⚠️ Stalled: ${t.warning}` }) : null,
      t.paused ? el("span", { class: "sub", text: "⏸ paused" }) : null);
    const d = t.deadlines;
    const deadlines = el("td", { class: "mono" });
    for (const part of [deadline("step", d.stepTimeoutInMs), deadline("wall", d.timeoutInMs), deadline("max", d.maxTurnTimeInMs)]) {
      if (part) deadlines.append(part, el("br"));
    }
    const actions = el("td", {});
    if (t.state === "running") {
      const b = el("button", { class: "abort", type: "button", dataset: { runId: t.runId, armed: armed.has(t.runId) ? "true" : "false" },
        title: "Abort this turn (its user is told it was stopped)", text: armed.has(t.runId) ? "Click to confirm" : "Abort",
        // Several rows have the same button: the name says whose turn.
        "aria-label": `${armed.has(t.runId) ? "Confirm abort" : "Abort"} of the turn in ${t.sessionKey}` });
      b.addEventListener("click", () => onAbort(b, t));
      actions.append(b);
    } else {
      actions.append(el("span", { class: "sub", text: `stopping (${t.stopReason})` }));
    }
    return el("tr", { class: "turn", dataset: { runId: t.runId, stalled: String(t.stalled), state: t.state, class: t.class || "" } },
      el("td", {}, el("span", { text: t.sessionKey }), t.chatRef ? el("span", { class: "sub", text: `chat ${t.chatRef}` }) : null),
      el("td", { text: t.channel }),
      el("td", { class: "mono" }, el("span", { title: t.runId, text: short(t.runId) }),
        t.traceId ? el("span", { class: "sub trace", title: `trace ${t.traceId}`, dataset: { traceId: t.traceId }, text: `trace ${t.traceId}` }) : null),
      el("td", {}, el("span", { text: dur(t.elapsedMs) }), el("span", { class: "sub", text: `since ${time(t.startedAt)}` })),
      stepCell, deadlines, actions);
  }

  // The abort button takes two clicks: the first arms it, the second (within
  // ARM_FOR) aborts.
  async function onAbort(button, t) {
    if (!armed.has(t.runId)) {
      armed.set(t.runId, setTimeout(() => { armed.delete(t.runId); refreshLive(); }, ARM_FOR));
      button.dataset.armed = "true";
      button.textContent = "Click to confirm";
      return;
    }
    clearTimeout(armed.get(t.runId));
    armed.delete(t.runId);
    button.disabled = true;
    button.textContent = "Aborting…";
    try {
      await api(`/api/turns/${encodeURIComponent(t.runId)}/abort`, { method: "POST", body: "{}" });
    } catch (err) {
      if (err instanceof AuthError) return showAuth(err.message);
      setStatus("error", `abort failed: ${err.message}`);
    }
    refreshAll();
  }

  // Stall history and recent aborts.
  function historyQuery() {
    const q = new URLSearchParams({ limit: "500" });
    const session = $("#filter-session").value.trim();
    const since = $("#filter-since").value;
    if (session) q.set("session", session);
    if (since) q.set("since", since);
    return q.toString();
  }

  function renderHistory(data) {
    const eps = data.episodes.slice().reverse(); // most recent first
    $("#stalls tbody").replaceChildren(...eps.slice(0, 100).map((e) =>
      el("tr", { class: "episode", dataset: { runId: e.runId, outcome: e.outcome } },
        el("td", { text: time(e.started) }),
        el("td", { text: e.sessionKey }),
        el("td", { class: "mono", title: e.runId, text: short(e.runId) }),
        el("td", { class: "mono", text: stepLabel(e.step) || "—" }),
        el("td", { text: e.outcome === "open" ? "still open" : dur(e.durationMs) }),
        el("td", { text: String(e.notices) }),
        el("td", {}, el("span", { class: `outcome-${e.outcome}`, text: e.outcome.replace("_", "-") }),
          e.stopReason ? el("span", { class: "reason", text: e.stopReason }) : null))));
    $("#no-stalls").hidden = eps.length > 0;

    const aborts = eps.filter((e) => e.outcome === "aborted" || e.outcome === "force_finalized")
      .sort((a, b) => (b.ended || "").localeCompare(a.ended || "")).slice(0, 25);
    $("#aborts tbody").replaceChildren(...aborts.map((e) =>
      el("tr", { class: "abort-row", dataset: { runId: e.runId, stopReason: e.stopReason || "" } },
        el("td", { text: time(e.ended) }),
        el("td", { text: e.sessionKey }),
        el("td", { class: "mono", title: e.runId, text: short(e.runId) }),
        el("td", {}, el("span", { class: "reason", text: e.stopReason || "—" })),
        el("td", { class: "mono", text: stepLabel(e.step) || "—" }),
        el("td", { class: `outcome-${e.outcome}`,
          text: e.outcome === "force_finalized" ? "force-finalized (runner ignored the abort)" : "stopped" }))));
    $("#no-aborts").hidden = aborts.length > 0;
  }

  function renderFigures(d) {
    const c = d.counters;
    const aborts = Object.entries(c.abortsByReason).filter(([, n]) => n > 0).map(([r, n]) => `${r} ${n}`).join(", ") || "none";
    $("#figures").textContent = `aborts: ${aborts} · force-finalized ${c.forceFinalizations} · progress notices ${c.progressNotices}` +
      ` · delivery retries ${c.deliveryRetries}, failures ${c.deliveryFailures} · ${d.build.version}`;
    // What needs the operator: a runner that cannot work (its probe failed,
    // or its ACP agent needs a sign-in), a part that could not be read.
    const problems = d.problems || [];
    $("#problems").replaceChildren(...problems.map((p) => el("li", { text: p })));
    $("#problems").hidden = problems.length === 0;
  }

  // Open questions.
  const answering = new Set(); // approval ids with an answer on its way

  function renderApprovals(data) {
    $("#approvals tbody").replaceChildren(...data.approvals.map(approvalRow));
    $("#approval-count").textContent = String(data.count);
    $("#no-approvals").hidden = data.count > 0;
  }

  function approvalRow(a) {
    const actions = el("td", { class: "answers" });
    for (const o of a.options || []) {
      const b = el("button", { class: `answer ${/^allow/.test(o.kind) ? "allow" : "reject"}`, type: "button",
        dataset: { optionId: o.id }, title: `Answer "${o.label}" as operator`, text: o.label,
        // Several questions may be open: the name says which ("Allow deploy in agent:main:web-…").
        "aria-label": `${o.label} ${a.tool || a.title} in ${a.sessionKey}` });
      if (answering.has(a.id)) b.disabled = true;
      b.addEventListener("click", () => onAnswer(a, o, actions));
      actions.append(b);
    }
    return el("tr", { class: "approval", dataset: { approvalId: a.id, runId: a.runId } },
      el("td", { text: a.sessionKey }),
      el("td", {}, el("span", { text: a.title }), a.detail ? el("span", { class: "sub", text: a.detail }) : null,
        a.tool ? el("span", { class: "sub", text: `tool: ${a.tool}` }) : null),
      el("td", { class: "mono", text: `denied in ${dur(a.expiresInMs)}` }),
      actions);
  }

  async function onAnswer(a, o, cell) {
    answering.add(a.id);
    for (const b of cell.querySelectorAll("button")) b.disabled = true;
    try {
      const res = await api(`/api/approvals/${encodeURIComponent(a.id)}`, { method: "POST", body: JSON.stringify({ optionId: o.id }) });
      setStatus("connected", res.already ? `already answered: ${res.text}` : res.text);
    } catch (err) {
      if (err instanceof AuthError) return showAuth(err.message);
      setStatus("error", `answer failed: ${err.message}`);
    } finally {
      answering.delete(a.id);
    }
    refreshAll();
  }

  // Polling.
  async function refreshLive() {
    if (authFailed) return;
    try {
      const [turns, approvals] = await Promise.all([api("/api/turns"), api("/api/approvals")]);
      renderTurns(turns);
      renderApprovals(approvals);
      setStatus("connected", `updated ${new Date().toLocaleTimeString()}`);
    } catch (err) {
      if (err instanceof AuthError) return showAuth(err.message);
      setStatus("error", `cannot reach the gateway: ${err.message}`);
    }
  }

  async function refreshHistory() {
    if (authFailed) return;
    try {
      const [hist, diag] = await Promise.all([api("/api/stall-history?" + historyQuery()), api("/api/diagnose")]);
      renderHistory(hist);
      renderFigures(diag);
    } catch (err) {
      if (err instanceof AuthError) return showAuth(err.message);
      setStatus("error", `cannot reach the gateway: ${err.message}`);
    }
  }

  function refreshAll() {
    refreshLive();
    refreshHistory();
  }

  $("#stall-filter").addEventListener("submit", (e) => e.preventDefault());
  $("#filter-session").addEventListener("change", refreshHistory);
  $("#filter-since").addEventListener("change", refreshHistory);

  setInterval(refreshLive, LIVE_EVERY);
  setInterval(refreshHistory, HISTORY_EVERY);
  refreshAll();
})();
