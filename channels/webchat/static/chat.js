// turnguard web chat: a client of the OpenClaw gateway protocol (v4) on the
// same origin. No build step, no dependencies.
//
// Flow: open ws://<host>/ → wait for connect.challenge → connect (token from
// the URL fragment "#token=…", the query "?token=…", this tab's storage, or
// the token form) → hello-ok → sessions.list + chat.history. chat.send with a
// fresh idempotencyKey starts a turn; its chat/agent events are drawn as they
// come: streamed text (each delta carries the full text), one line per tool
// step (a "still working" notice replaces that line's note in place), and a
// terminal final | aborted (warning with the stop reason) | error.
//
// Busy sessions: a message sent while the session's turn runs is answered
// "queued" (it keeps its bubble, marked "Queued — next", and becomes the
// running turn when its run starts — same runId), "steered" (handed to the
// running turn) or refused ("not sent", its text back in the textbox).
//
// Re-attach: chat.history's answer carries turnguard.activeRun and
// turnguard.queue (docs/protocol.md §6): on load, on a session switch and
// after a reconnect the page draws the running turn's steps, its "still
// working" notice and a working Stop, and the queued messages. Events that
// arrive while the history loads are held and replayed after it.
//
// Retry: the notice of a turn that timed out, was interrupted, superseded or
// failed has a Retry button that sends the same text again as a new turn.
//
// Approvals: a turn's question (the `approval` event, docs/approvals.md) is a
// card in its run with one button per option; a click answers it with
// approval.resolve and disables the buttons; the card then shows how the
// question was settled (who chose what, no answer in time, stopped) —
// also when it was settled elsewhere (another tab, the TUI, an operator).
// chat.history's turnguard.approvals redraws the open ones after a reload.
// A finished turn's step lines and settled cards come back on reload from
// its first reply's turnguard field (finishedTurn).
//
// Others' turns: a turn started elsewhere (another tab, the TUI, a page on
// another replica) is drawn from its events; its lifecycle start carries
// the user's message (data.userText), drawn as that turn's bubble.
//
// Welcome: an empty conversation shows what can be typed (/help, demo
// examples as buttons that fill the textbox); the first message replaces it.
//
// Identity: connect carries a device block signing the challenge with an
// Ed25519 key this browser keeps (see "device identity" below), so the turns
// this page starts stay its own across reconnects and its Stop keeps working.
"use strict";

(() => {
  const PROTOCOL = 4;
  const CLIENT_VERSION = "turnguard-web/1";
  // ANY_RUN as the active run: a turn runs that this page has not seen start
  // (its message was queued behind it); Stop then stops the session's turn.
  const ANY_RUN = "*";
  const MAX_BACKOFF_MS = 10000;

  const $ = (id) => document.getElementById(id);
  const ui = {
    messages: $("messages"), input: $("input"), send: $("send"), stop: $("stop"),
    session: $("session"), newSession: $("new-session"), status: $("status"), tokenForm: $("token-form"),
    token: $("token"), tokenReason: $("token-reason"), composer: $("composer"), suggest: $("suggest"),
  };

  const state = {
    ws: null,
    connected: false,
    seq: 0,
    pending: new Map(), // request id → {resolve, reject}
    token: takeToken(),
    sessionKey: canonical(initialSession()),
    runs: new Map(), // runId → view
    activeRun: "", // the session's running turn, "" when idle
    queued: new Map(), // runId → [user bubbles] waiting behind the running turn (collect: several)
    loading: null, // {key, held: [[event, payload]]} while chat.history is on its way
    backoff: 500,
    stopReconnect: false,
    instanceId: uuid(),
    sessionsTimer: 0,
    queueTimer: 0,
    commands: new Set(), // idempotency keys of the commands sent (their answers are not runs)
    device: null, // Promise of this browser's device key (null inside: none)
    approvals: new Map(), // approval id → card view
    suggestions: null, // {key, list: Promise of [{name, description}]}: commands.list of the session, asked when "/" is typed
    picked: 0, // the highlighted suggestion
  };

  // ---- helpers -----------------------------------------------------------

  function uuid() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b); // available outside secure contexts too
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  // canonical turns a bare session key into the agent:main:<key> spelling
  // the gateway uses, so events in either spelling match.
  function canonical(key) {
    key = String(key || "").trim() || "main";
    return key.startsWith("agent:") ? key : `agent:main:${key}`;
  }

  function shortKey(key) {
    return key.startsWith("agent:main:") ? key.slice("agent:main:".length) : key;
  }

  // takeToken reads the token from the fragment or query (then removes it
  // from the address bar so it is not bookmarked or shared) or this tab's
  // storage.
  function takeToken() {
    const url = new URL(location.href);
    const frag = new URLSearchParams(url.hash.replace(/^#/, ""));
    let token = frag.get("token") || url.searchParams.get("token") || "";
    if (token) {
      frag.delete("token");
      url.searchParams.delete("token");
      const hash = frag.toString();
      url.hash = hash ? `#${hash}` : "";
      history.replaceState(null, "", url.toString());
      try { sessionStorage.setItem("turnguard.token", token); } catch (_) { /* storage off */ }
      return token;
    }
    try { token = sessionStorage.getItem("turnguard.token") || ""; } catch (_) { token = ""; }
    return token;
  }

  function initialSession() {
    const q = new URL(location.href).searchParams.get("session");
    if (q) return q;
    try { return localStorage.getItem("turnguard.session") || "main"; } catch (_) { return "main"; }
  }

  function rememberSession(key) {
    try { localStorage.setItem("turnguard.session", key); } catch (_) { /* storage off */ }
  }

  function textOf(message) {
    if (!message) return "";
    if (typeof message === "string") return message;
    if (typeof message.text === "string") return message.text;
    if (!Array.isArray(message.content)) return "";
    return message.content.filter((c) => c && c.type === "text").map((c) => c.text || "").join("");
  }

  // short is text cut to one line of at most 40 characters, for names.
  function short(text) {
    const t = String(text || "").replace(/\s+/g, " ").trim();
    return t.length > 40 ? `${t.slice(0, 39)}\u2026` : t;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function nearBottom() {
    const m = ui.messages;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
  }

  function append(node, parent) {
    const stick = nearBottom();
    const w = ui.messages.querySelector(".welcome");
    if (w && w !== node) w.remove();
    (parent || ui.messages).appendChild(node);
    if (stick) ui.messages.scrollTop = ui.messages.scrollHeight;
    return node;
  }

  function keepScrolled(fn) {
    const stick = nearBottom();
    fn();
    if (stick) ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  function setStatus(s, text) {
    ui.status.dataset.state = s;
    ui.status.textContent = text;
  }

  function setActive(runId) {
    state.activeRun = runId || "";
    ui.stop.disabled = !state.connected || !state.activeRun;
    ui.messages.dataset.activeRun = state.activeRun;
  }

  function updateButtons() {
    ui.send.disabled = !state.connected;
    ui.stop.disabled = !state.connected || !state.activeRun;
  }

  // ---- rendering ---------------------------------------------------------

  function userMessage(text, parent) {
    return append(el("div", "msg user", text), parent);
  }

  // EXAMPLES are what the welcome offers to try: each fills the textbox.
  const EXAMPLES = [
    ["/help", "what you can type here"],
    ["/steps ask:deploy say:Finished", "a request that asks before it deploys (Allow or Deny)"],
    ["/steps web_search:300ms shell:hang", "a step that hangs: watch the \u201cstill working\u201d note, or Stop it"],
  ];

  // showWelcome shows, in an empty conversation, what the page is and what
  // to type; the first message drawn (append) removes it.
  function showWelcome() {
    if (ui.messages.querySelector(".msg, .notice, .run, .welcome")) return;
    const w = el("section", "welcome");
    w.setAttribute("aria-labelledby", "welcome-title");
    const h = el("h2", "", "Welcome to turnguard");
    h.id = "welcome-title";
    w.appendChild(h);
    w.appendChild(el("p", "", "Type a message below to talk to the assistant. Its steps show as they run; Stop ends a request at any time. Try one of these:"));
    const list = el("ul", "examples");
    for (const [text, what] of EXAMPLES) {
      const li = el("li");
      const b = el("button", "example", text);
      b.type = "button";
      b.title = "Put this in the message box";
      b.addEventListener("click", () => { ui.input.value = text; ui.input.focus(); });
      li.append(b, el("span", "example-what", ` \u2014 ${what}`));
      list.appendChild(li);
    }
    w.appendChild(list);
    ui.messages.appendChild(w);
  }

  // setBubbleStatus marks a user message (data-status: not-sent, queued,
  // steered, dropped; "" = sent) with a line of words under its text.
  function setBubbleStatus(bubble, status, words, detail) {
    if (status) bubble.dataset.status = status; else delete bubble.dataset.status;
    let line = bubble.querySelector(".msg-status");
    if (!words) {
      if (line) line.remove();
      return;
    }
    if (!line) line = bubble.appendChild(el("span", "msg-status"));
    line.textContent = words;
    if (detail) line.title = detail; else line.removeAttribute("title");
  }

  // STOP_WORDS says why a turn stopped in words; the code itself stays in
  // the notice's data-stop-reason attribute, never in its text.
  const STOP_WORDS = {
    timeout: "stopped: took too long",
    step_timeout: "stopped: no progress",
    max_turn_time: "stopped: time limit reached",
    user: "stopped by you",
    shutdown: "stopped: gateway shut down",
    interrupted: "stopped: interrupted",
    superseded: "stopped: replaced by your newer message",
    error: "failed",
    aborted: "stopped",
  };

  function stopWords(reason) {
    return STOP_WORDS[reason] || "stopped";
  }

  // RETRYABLE are the stop reasons whose notice offers Retry: the turn did
  // not get to finish through no choice of the user's (a stop by the user
  // is not retried with one tap).
  const RETRYABLE = new Set(["timeout", "step_timeout", "max_turn_time", "interrupted", "superseded", "shutdown", "error"]);

  // notice draws a warning (a stop: timeout, user, shutdown…) or an error.
  // retryText, for a retryable stop, adds a Retry button that sends it again.
  function notice(kind, text, stopReason, parent, retryText) {
    const n = el("div", `notice ${kind}`);
    n.setAttribute("role", kind === "info" ? "status" : "alert");
    if (stopReason) n.dataset.stopReason = stopReason;
    n.appendChild(el("span", "notice-text", text));
    if (stopReason) n.appendChild(el("span", "stop-reason", stopWords(stopReason)));
    if (retryText && RETRYABLE.has(stopReason)) {
      const b = el("button", "retry", "Retry");
      b.type = "button";
      b.title = "Send the same message again";
      // Several notices may offer Retry: the name says which message.
      b.setAttribute("aria-label", `Retry \u201c${short(retryText)}\u201d`);
      b.addEventListener("click", () => {
        if (!state.connected) return;
        b.disabled = true;
        sendText(retryText);
      });
      n.appendChild(b);
    }
    return append(n, parent);
  }

  // ---- Markdown ------------------------------------------------------------
  //
  // renderMarkdown turns a reply into DOM nodes: paragraphs, headings (shown
  // bold), "-"/"*"/"1." lists, ``` fenced code, `code`, **bold**, *italic*,
  // [links](https://…) and bare http(s) addresses. Every piece of the reply
  // becomes a text node (never HTML), so a tag in a reply shows as text; a
  // link is made only for http: and https: addresses and opens in a new tab
  // without an opener or a referrer. An unclosed fence (a reply still
  // streaming) runs to the end.

  const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
  const HEADING = /^\s{0,3}#{1,6}\s+(.*)$/;
  const ITEM = /^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/;
  // A link's text and address are bounded (500 and 2000 characters): from
  // every "[" the text may not run to the end of the line, or a line of
  // many "[" takes time quadratic in its length.
  const INLINE = /`([^`\n]+)`|\*\*(\S(?:[^*\n]*?\S)?)\*\*|\*([^*\s](?:[^*\n]*?[^*\s])?)\*|\[([^\]\n]{1,500})\]\(([^()\s]{1,2000})\)|(https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"])/g;

  function link(href, label, parent) {
    let url = null;
    try { url = new URL(href); } catch (_) { url = null; }
    if (!url || (url.protocol !== "http:" && url.protocol !== "https:")) return false;
    const a = el("a", "", label);
    a.href = url.href;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    parent.appendChild(a);
    return true;
  }

  function inline(text, parent) {
    const re = new RegExp(INLINE.source, "g");
    let last = 0;
    let m;
    while ((m = re.exec(text))) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      last = re.lastIndex;
      if (m[1] !== undefined) parent.appendChild(el("code", "", m[1]));
      else if (m[2] !== undefined || m[3] !== undefined) {
        const e = el(m[2] !== undefined ? "strong" : "em");
        inline(m[2] !== undefined ? m[2] : m[3], e);
        parent.appendChild(e);
      } else if (m[4] !== undefined) {
        if (!link(m[5], m[4], parent)) parent.appendChild(document.createTextNode(m[0]));
      } else if (!link(m[6], m[6], parent)) parent.appendChild(document.createTextNode(m[0]));
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
    return parent;
  }

  function renderMarkdown(src) {
    const out = document.createDocumentFragment();
    const lines = String(src || "").replace(/\r\n?/g, "\n").split("\n");
    const plain = (l) => l.trim() && !FENCE.test(l) && !HEADING.test(l) && !ITEM.test(l);
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m = FENCE.exec(line);
      if (m) {
        const body = [];
        for (i++; i < lines.length && !lines[i].trim().startsWith(m[1]); i++) body.push(lines[i]);
        i++;
        const code = el("code", "", body.join("\n"));
        if (m[2]) code.dataset.lang = m[2];
        out.appendChild(el("pre")).appendChild(code);
      } else if (!line.trim()) {
        i++;
      } else if ((m = HEADING.exec(line))) {
        out.appendChild(el("p", "md-heading")).appendChild(inline(m[1], el("strong")));
        i++;
      } else if ((m = ITEM.exec(line))) {
        const ordered = !m[1];
        const list = out.appendChild(el(ordered ? "ol" : "ul"));
        if (ordered && m[2] !== "1") list.start = Number(m[2]);
        while (i < lines.length && (m = ITEM.exec(lines[i])) && !m[1] === ordered) {
          const li = inline(m[3], list.appendChild(el("li")));
          for (i++; i < lines.length && /^\s{2,}\S/.test(lines[i]) && !ITEM.test(lines[i]); i++) {
            li.appendChild(document.createTextNode("\n"));
            inline(lines[i].trim(), li);
          }
        }
      } else {
        const para = [];
        while (i < lines.length && plain(lines[i])) para.push(lines[i++]);
        inline(para.join("\n"), out.appendChild(el("p")));
      }
    }
    return out;
  }

  // assistantMessage draws a finished reply (history) as Markdown.
  function assistantMessage(text, parent) {
    const m = el("div", "msg assistant md");
    m.appendChild(renderMarkdown(text));
    return append(m, parent);
  }

  // run returns the view of a run, creating its block at the end of the
  // conversation.
  function run(runId) {
    let v = state.runs.get(runId);
    if (v) return v;
    const block = el("div", "run");
    block.dataset.runId = runId;
    const steps = el("div", "steps");
    block.appendChild(steps);
    append(block);
    v = { id: runId, block, steps, stepsById: new Map(), reply: null, text: "", done: false, userText: "", started: false };
    state.runs.set(runId, v);
    return v;
  }

  // endOf returns where the end of run v is drawn: its block while nothing
  // follows it, else a new block of the run at the bottom of the
  // conversation — a stop confirmed after later messages (the typed /stop,
  // a queued message) is shown where the user is looking, not above them.
  function endOf(v) {
    if (!v.block.nextElementSibling) return v.block;
    const tail = el("div", "run run-end");
    tail.dataset.runId = v.id;
    return append(tail);
  }

  function replyText(v, text, streaming) {
    if (!v.reply) {
      if (!text && streaming) return;
      v.reply = el("div", "msg assistant md");
      v.block.appendChild(v.reply);
    }
    v.text = text;
    keepScrolled(() => {
      v.reply.replaceChildren(renderMarkdown(text));
      v.reply.classList.toggle("streaming", !!streaming);
    });
  }

  function step(v, id, name) {
    let s = v.stepsById.get(id);
    if (s) {
      if (name && !s.name) { s.name = name; s.nameEl.textContent = `🛠️ ${name}`; }
      return s;
    }
    const line = el("div", "step");
    line.dataset.stepId = id;
    const nameEl = el("span", "step-name", `🛠️ ${name || "step"}`);
    const statusEl = el("span", "step-status");
    const noteEl = el("span", "step-note");
    line.append(nameEl, statusEl, noteEl);
    keepScrolled(() => v.steps.appendChild(line));
    s = { line, name: name || "", nameEl, statusEl, noteEl };
    v.stepsById.set(id, s);
    setStepStatus(s, "running");
    return s;
  }

  function setStepStatus(s, status) {
    s.line.dataset.status = status;
    s.statusEl.textContent = { running: "(running)", completed: "✓", failed: "✗ failed", stopped: "■ stopped" }[status] || `(${status})`;
  }

  function setStepNote(s, note) {
    s.noteEl.textContent = note || "";
    s.line.classList.toggle("has-note", !!note);
  }

  // finishRun ends a run's view. For a stopped run (aborted), the step that
  // was cut off is "stopped", not "failed": the gateway reports the step it
  // closes at the end of a run as an error result.
  function finishRun(v, aborted) {
    v.done = true;
    if (v.reply) v.reply.classList.remove("streaming");
    for (const s of v.stepsById.values()) {
      const st = s.line.dataset.status;
      if (st === "running" || (aborted && st === "failed")) setStepStatus(s, "stopped");
      setStepNote(s, "");
    }
    if (state.activeRun === v.id) setActive("");
  }

  // othersMessage draws the message that started run v when this page did
  // not send it (another tab, the TUI, a page on another replica): the
  // bubble above the run's block, and the text Retry sends again.
  function othersMessage(v, text) {
    if (typeof text !== "string" || !text || v.userText || state.queued.has(v.id)) return;
    v.userText = text;
    const bubble = el("div", "msg user", text);
    ui.messages.insertBefore(bubble, v.block);
    const w = ui.messages.querySelector(".welcome");
    if (w) w.remove();
  }

  // ---- approvals -------------------------------------------------------------

  // approvalCard draws (or returns) the card of question a in run runId.
  function approvalCard(runId, a, text) {
    let c = state.approvals.get(a.id);
    if (c) return c;
    const v = run(String(runId));
    const card = el("div", "approval");
    card.setAttribute("role", "group");
    card.dataset.approvalId = a.id;
    card.dataset.state = "open";
    const textEl = el("div", "approval-text", text || `🔐 Approval needed: ${a.title || ""}`);
    const buttons = el("div", "approval-buttons");
    c = { id: a.id, runId: v.id, card, textEl, buttons, settled: false };
    for (const o of Array.isArray(a.options) ? a.options : []) {
      if (!o || !o.id) continue;
      const b = el("button", `approval-option ${/^allow/.test(o.kind || "") ? "allow" : "reject"}`, String(o.label || o.id));
      b.type = "button";
      b.dataset.optionId = o.id;
      // Several cards may be open: the name says what it answers ("Allow deploy").
      const what = short(a.tool || a.title || "");
      if (what) b.setAttribute("aria-label", `${b.textContent} ${what}`);
      b.addEventListener("click", () => answer(c, o.id, b));
      buttons.appendChild(b);
    }
    const err = el("div", "approval-error");
    c.errEl = err;
    card.append(textEl, buttons, err);
    keepScrolled(() => v.block.appendChild(card));
    state.approvals.set(a.id, c);
    return c;
  }

  // settleCard shows how a question was settled and turns its buttons off.
  function settleCard(c, a, text) {
    c.settled = true;
    c.card.dataset.state = "settled";
    c.card.dataset.outcome = (a && a.outcome) || "";
    if (text) c.textEl.textContent = text;
    c.errEl.textContent = "";
    for (const b of c.buttons.querySelectorAll("button")) {
      b.disabled = true;
      b.classList.toggle("chosen", !!a && a.outcome === "selected" && b.dataset.optionId === a.optionId);
    }
  }

  async function answer(c, optionId, button) {
    if (c.settled || !state.connected) return;
    for (const b of c.buttons.querySelectorAll("button")) b.disabled = true;
    button.classList.add("pending");
    try {
      const res = await request("approval.resolve", { id: c.id, optionId, sessionKey: state.sessionKey });
      settleCard(c, res && res.approval, res && res.text);
    } catch (err) {
      button.classList.remove("pending");
      const code = (err.info && err.info.details && err.info.details.code) || "";
      if (code === "APPROVAL_NOT_FOUND") {
        settleCard(c, null, `${c.textEl.textContent}\n(no longer open)`);
        return;
      }
      c.errEl.textContent = `Not answered: ${err.message}`;
      if (code !== "APPROVAL_FORBIDDEN") for (const b of c.buttons.querySelectorAll("button")) b.disabled = false;
    }
  }

  function onApproval(p) {
    if (!p.runId || !mine(p) || !p.approval || !p.approval.id) return;
    const a = p.approval;
    if (p.state === "requested") {
      approvalCard(p.runId, a, p.text);
      return;
    }
    if (p.state === "resolved") {
      const c = state.approvals.get(a.id) || approvalCard(p.runId, a, p.text);
      settleCard(c, a, p.text);
    }
  }

  // ---- queued messages -----------------------------------------------------

  // queueLabel is a queued message's words, by what the gateway did with
  // it (busy: queue, collect, steer — queued because the turn cannot take
  // it —, interrupt) and how many queued turns are before it (ahead, as the
  // gateway counts them: the running one not included).
  function queueLabel(busy, ahead) {
    const where = ahead > 0 ? `Queued (${ahead} before it)` : "Queued — next";
    switch (busy) {
      case "collect": return "Queued — answered together with your other new messages";
      case "interrupt": return "Next — the current request is being replaced";
      case "steer": return `${where} — the assistant can't take it mid-request`;
      default: return where;
    }
  }

  // markQueued marks bubble as waiting to run as runId; ahead counts the
  // queued messages before it; detail is the gateway's sentence for it.
  // ownId is the message's own run id (its idempotency key; in collect
  // mode not its turn's): its Cancel button cancels that message only.
  function markQueued(bubble, runId, busy, ahead, detail, ownId) {
    bubble.dataset.runId = runId;
    bubble.dataset.ownId = ownId || runId;
    bubble.dataset.busy = busy || "queue";
    bubble.dataset.ahead = String(ahead || 0);
    setBubbleStatus(bubble, "queued", queueLabel(bubble.dataset.busy, ahead || 0), detail);
    cancelButton(bubble);
    const list = state.queued.get(runId) || [];
    if (!list.includes(bubble)) list.push(bubble);
    state.queued.set(runId, list);
  }

  // cancelButton adds a queued message's Cancel button: chat.abort of its
  // own run id, only while it waits (queued: true — a message that started
  // meanwhile keeps running). A cancelled message is shown dropped, with
  // the gateway's words; one that no longer waits just loses the button.
  function cancelButton(bubble) {
    if (bubble.querySelector(".msg-cancel")) return;
    const b = bubble.appendChild(el("button", "msg-cancel", "Cancel"));
    b.type = "button";
    b.title = "Cancel this message before it runs";
    b.addEventListener("click", async () => {
      b.disabled = true;
      const own = bubble.dataset.ownId;
      let res;
      try {
        res = await request("chat.abort", { sessionKey: state.sessionKey, runId: own, queued: true });
      } catch (err) {
        b.disabled = false;
        notice("error", err.message);
        return;
      }
      b.remove();
      if (!res || !res.aborted) { checkQueueSoon(); return; }
      unqueue(bubble, "cancelled — not sent", res.text);
    });
  }

  // onQueue takes the gateway's "queue" event: a queued message of this
  // session was cancelled (here, in another tab, or by its Telegram Cancel
  // button), so its bubble reads not sent at once.
  function onQueue(p) {
    if (!p || p.state !== "cancelled" || !p.runId || !mine(p)) return;
    for (const list of [...state.queued.values()]) {
      for (const b of [...list]) {
        if (b.dataset.ownId === String(p.runId)) unqueue(b, "cancelled — not sent", p.text);
      }
    }
  }

  // unqueue marks one queued message (bubble) as not sent with words —
  // cancelled, or dropped to make room (busy.overflow drop-old) — and,
  // when its turn has no other message, moves the turns after it up. A
  // bubble already unqueued (its "queue" event came before the answer)
  // is left as it is.
  function unqueue(bubble, words, detail) {
    const c = bubble.querySelector(".msg-cancel");
    if (c) c.remove();
    const turn = bubble.dataset.runId;
    if (!(state.queued.get(turn) || []).includes(bubble)) return;
    const list = (state.queued.get(turn) || []).filter((x) => x !== bubble);
    if (list.length) state.queued.set(turn, list); else state.queued.delete(turn);
    setBubbleStatus(bubble, "dropped", words, detail);
    if (list.length) return;
    // Its turn is gone from the queue: the turns after it move up.
    const gone = Number(bubble.dataset.ahead || 0);
    for (const others of state.queued.values()) {
      for (const o of others) {
        const ahead = Number(o.dataset.ahead || 0);
        if (ahead <= gone) continue;
        o.dataset.ahead = String(ahead - 1);
        const line = o.querySelector(".msg-status");
        setBubbleStatus(o, "queued", queueLabel(o.dataset.busy, ahead - 1), line && line.title);
      }
    }
  }

  // dropQueued marks the queued messages whose own run ids are in ids
  // dropped (busy.overflow drop-old made room for a newer one).
  function dropQueued(ids) {
    for (const list of [...state.queued.values()]) {
      for (const b of [...list]) {
        if (ids.includes(b.dataset.ownId)) unqueue(b, "dropped — not sent");
      }
    }
  }

  // started turns the queued messages of runId into sent ones (their turn
  // runs now) and moves the others up the queue.
  function started(runId) {
    const list = state.queued.get(runId);
    if (!list) return;
    state.queued.delete(runId);
    for (const b of list) {
      setBubbleStatus(b, "", "");
      const c = b.querySelector(".msg-cancel");
      if (c) c.remove();
    }
    for (const others of state.queued.values()) {
      for (const b of others) {
        const ahead = Math.max(0, Number(b.dataset.ahead || 0) - 1);
        b.dataset.ahead = String(ahead);
        const line = b.querySelector(".msg-status");
        setBubbleStatus(b, "queued", queueLabel(b.dataset.busy, ahead), line && line.title);
      }
    }
  }

  // dropQueue marks the queued messages of runIds (all when omitted)
  // dropped — a /stop or /new discards the session's queue — and removes
  // their empty runs.
  function dropQueue(runIds) {
    for (const [runId, list] of [...state.queued]) {
      if (runIds && !runIds.includes(runId)) continue;
      for (const b of list) {
        setBubbleStatus(b, "dropped", "dropped — not sent");
        const c = b.querySelector(".msg-cancel");
        if (c) c.remove();
      }
      const v = state.runs.get(runId);
      if (v && !v.reply && v.stepsById.size === 0) {
        v.block.remove();
        state.runs.delete(runId);
      }
      state.queued.delete(runId);
    }
  }

  // checkQueueSoon asks the gateway, a moment after a turn of the session
  // ended, which of the messages shown as queued still wait: one that
  // neither waits nor has started was dropped (a /stop from another client)
  // or joined the running turn.
  function checkQueueSoon() {
    if (!state.queued.size) return;
    clearTimeout(state.queueTimer);
    state.queueTimer = setTimeout(checkQueue, 1500);
  }

  async function checkQueue() {
    const key = state.sessionKey;
    if (!state.queued.size || !state.connected || state.loading) return;
    let res;
    try { res = await request("chat.history", { sessionKey: key, limit: 1 }); } catch (_) { return; }
    if (key !== state.sessionKey || state.loading) return;
    const live = (res && res.turnguard) || {};
    const waiting = new Set((live.queue || []).map((q) => q && (q.turnRunId || q.runId)));
    const running = live.activeRun && live.activeRun.runId;
    // A run's events come before an answer computed after them: a run that
    // started is known here by now.
    const gone = [...state.queued.keys()].filter((id) => !waiting.has(id) && id !== running && !(state.runs.get(id) || {}).started);
    if (!gone.length) return;
    // Messages leave the queue by starting or all at once by a stop. With a
    // turn running, they were joined into it (collect: after a reload the
    // page knows each collected message by its own id, the turn runs as the
    // first's); with none, they were dropped.
    if (!running) {
      dropQueue(gone);
      return;
    }
    for (const id of gone) {
      started(id);
      const v = state.runs.get(id);
      if (v && !v.started && !v.reply && v.stepsById.size === 0) { // joined: its own run never comes
        v.block.remove();
        state.runs.delete(id);
      }
    }
  }

  // ---- device identity ---------------------------------------------------
  //
  // The gateway gives a run to the identity that started it: a device key the
  // client proved by signing the connect challenge, else the connection
  // (docs/protocol.md §3, §6 chat.abort). So the page signs, as the TUI does,
  // or its Stop would be refused after any reconnect.
  //
  // One key pair per browser profile and origin, made with WebCrypto and kept
  // in IndexedDB with a non-extractable private key: reloads, new tabs and
  // restarts of this browser are the same device (like the TUI's one key per
  // machine), and a script or extension that reads the page's storage can use
  // the key while it runs in the page but cannot copy it out. If IndexedDB is
  // unavailable (some private windows) the key lives as long as the page.
  // Without WebCrypto Ed25519 (an old browser, or a plain-http address other
  // than localhost, where crypto.subtle does not exist) the page connects
  // without a device block: everything works, and only a turn that was running
  // across a reconnect can no longer be stopped from here.

  const DEVICE_DB = "turnguard";
  const DEVICE_STORE = "device";
  const DEVICE_ENTRY = "ed25519";
  const DEVICE_WAIT_MS = 3000;

  function hex(bytes) {
    return Array.from(bytes, (x) => x.toString(16).padStart(2, "0")).join("");
  }

  function base64url(bytes) {
    let bin = "";
    for (const b of bytes) bin += String.fromCharCode(b);
    return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  // asciiLower trims and lowercases ASCII letters only, as the gateway does
  // for platform and deviceFamily before it checks the signature.
  function asciiLower(s) {
    return String(s || "").trim().replace(/[A-Z]/g, (c) => c.toLowerCase());
  }

  // deviceStore runs one request on the key store and resolves with its result.
  function deviceStore(mode, fn) {
    return new Promise((resolve, reject) => {
      const open = indexedDB.open(DEVICE_DB, 1);
      open.onupgradeneeded = () => open.result.createObjectStore(DEVICE_STORE);
      open.onblocked = () => reject(new Error("key store blocked"));
      open.onerror = () => reject(open.error);
      open.onsuccess = () => {
        const db = open.result;
        let req;
        try {
          const tx = db.transaction(DEVICE_STORE, mode);
          req = fn(tx.objectStore(DEVICE_STORE));
          tx.oncomplete = () => { db.close(); resolve(req.result); };
          tx.onabort = () => { db.close(); reject(tx.error || req.error); };
        } catch (err) {
          db.close();
          reject(err);
        }
      };
    });
  }

  function usableKeys(k) {
    return !!(k && k.privateKey && k.publicKey && k.privateKey.algorithm && k.privateKey.algorithm.name === "Ed25519");
  }

  // browserKeys returns the stored key pair or makes one; when two tabs make
  // one at once, the first one stored wins and both use it.
  async function browserKeys() {
    let stored = null;
    try { stored = await deviceStore("readonly", (s) => s.get(DEVICE_ENTRY)); } catch (_) { stored = null; }
    if (usableKeys(stored)) return stored;
    const made = await crypto.subtle.generateKey({ name: "Ed25519" }, false, ["sign", "verify"]);
    try {
      await deviceStore("readwrite", (s) => s.add(made, DEVICE_ENTRY));
    } catch (_) {
      try { stored = await deviceStore("readonly", (s) => s.get(DEVICE_ENTRY)); } catch (_) { stored = null; }
      if (usableKeys(stored)) return stored; // another tab stored its pair first
    }
    return made; // stored, or kept for this page only
  }

  // loadDevice resolves with {id, publicKey, privateKey} or null when this
  // browser cannot sign with Ed25519.
  async function loadDevice() {
    if (!globalThis.crypto || !crypto.subtle) return null;
    try {
      const keys = await browserKeys();
      const raw = new Uint8Array(await crypto.subtle.exportKey("raw", keys.publicKey));
      const sum = new Uint8Array(await crypto.subtle.digest("SHA-256", raw));
      return { id: hex(sum), publicKey: base64url(raw), privateKey: keys.privateKey };
    } catch (_) {
      console.info("turnguard: no Ed25519 in this browser; a turn can be stopped from this page while it stays connected");
      return null;
    }
  }

  // deviceProof signs the challenge for the connect params p, byte for byte
  // the text the gateway verifies (channels/ws/device.go):
  // v3|id|client.id|client.mode|role|scopes,…|signedAt|token|nonce|platform|deviceFamily,
  // signedAt being the challenge's ts. null when there is no key.
  async function deviceProof(challenge, p) {
    if (!state.device) state.device = loadDevice();
    const dev = await Promise.race([state.device, new Promise((r) => setTimeout(() => r(null), DEVICE_WAIT_MS))]);
    if (!dev) return null;
    const signedAt = Number.isSafeInteger(challenge.ts) ? challenge.ts : Date.now();
    const text = ["v3", dev.id, p.client.id, p.client.mode, p.role, p.scopes.join(","), String(signedAt),
      (p.auth && p.auth.token) || "", challenge.nonce, asciiLower(p.client.platform), asciiLower(p.client.deviceFamily)].join("|");
    try {
      const sig = await crypto.subtle.sign({ name: "Ed25519" }, dev.privateKey, new TextEncoder().encode(text));
      return { id: dev.id, publicKey: dev.publicKey, signature: base64url(new Uint8Array(sig)), signedAt, nonce: challenge.nonce };
    } catch (_) {
      return null;
    }
  }

  // ---- protocol ----------------------------------------------------------

  function request(method, params) {
    return new Promise((resolve, reject) => {
      if (!state.ws || state.ws.readyState !== WebSocket.OPEN) {
        reject(new Error("not connected"));
        return;
      }
      const id = `web-${++state.seq}`;
      state.pending.set(id, { resolve, reject });
      state.ws.send(JSON.stringify({ type: "req", id, method, params: params || {} }));
    });
  }

  function connect() {
    setStatus("connecting", "connecting…");
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`);
    state.ws = ws;
    ws.onmessage = (e) => {
      let frame;
      try { frame = JSON.parse(e.data); } catch (_) { return; }
      if (frame && typeof frame === "object") onFrame(ws, frame);
    };
    ws.onclose = (e) => onClose(ws, e);
  }

  function onClose(ws, e) {
    if (state.ws !== ws) return;
    state.ws = null;
    state.connected = false;
    for (const p of state.pending.values()) p.reject(new Error("connection closed"));
    state.pending.clear();
    updateButtons();
    if (state.stopReconnect) return;
    const why = e.code === 1012 ? "gateway restarting" : "disconnected";
    setStatus("disconnected", `${why} — reconnecting…`);
    setTimeout(connect, state.backoff);
    state.backoff = Math.min(state.backoff * 2, MAX_BACKOFF_MS);
  }

  function onFrame(ws, f) {
    if (f.type === "res") {
      const p = state.pending.get(f.id);
      if (!p) return;
      state.pending.delete(f.id);
      if (f.ok) p.resolve(f.payload);
      else p.reject(Object.assign(new Error((f.error && f.error.message) || "request failed"), { info: f.error || {} }));
      return;
    }
    if (f.type !== "event") return;
    const payload = f.payload || {};
    switch (f.event) {
      case "connect.challenge": hello(ws, payload); break;
      case "chat": case "agent": case "approval":
        // While the history loads, this session's run events wait: they are
        // drawn after it (loadHistory), on top of what it shows.
        if (state.loading && mine(payload)) state.loading.held.push([f.event, payload]);
        else runEvent(f.event, payload);
        break;
      case "queue": onQueue(payload); break;
      case "sessions.changed": refreshSessionsSoon(); break;
      case "shutdown": setStatus("disconnected", "gateway shutting down…"); break;
      default: break; // tick, presence, …
    }
  }

  async function hello(ws, challenge) {
    if (!challenge.nonce) return;
    const params = {
      minProtocol: PROTOCOL, maxProtocol: PROTOCOL,
      client: {
        id: "turnguard-web", displayName: "turnguard web chat", version: CLIENT_VERSION,
        platform: "web", deviceFamily: "browser", mode: "webchat", instanceId: state.instanceId,
      },
      caps: ["tool-events"],
      role: "operator",
      scopes: ["operator.read", "operator.write", "operator.admin"],
    };
    if (state.token) params.auth = { token: state.token };
    const device = await deviceProof(challenge, params);
    if (state.ws !== ws) return;
    if (device) params.device = device;
    try {
      await request("connect", params);
    } catch (err) {
      const code = (err.info && err.info.details && err.info.details.code) || "";
      if (code.startsWith("AUTH_") || /unauthorized/i.test(err.message)) {
        askToken(code === "AUTH_TOKEN_MISSING" || !state.token
          ? "This gateway needs a token."
          : "The gateway refused this token.");
      } else {
        setStatus("disconnected", `connect failed: ${err.message}`);
      }
      return;
    }
    if (state.ws !== ws) return;
    state.connected = true;
    state.backoff = 500;
    ui.tokenForm.hidden = true;
    setStatus("connected", "connected");
    updateButtons();
    // Watch every session's events (filtered by sessionKey here), so a turn
    // started elsewhere — the TUI, another tab — shows up too.
    try { await request("sessions.subscribe", {}); } catch (_) { /* events of our own sends still arrive */ }
    await refreshSessions();
    await loadHistory();
  }

  function askToken(reason) {
    state.stopReconnect = true;
    if (state.ws) state.ws.close();
    setStatus("auth", "token required");
    ui.tokenReason.textContent = reason;
    ui.tokenForm.hidden = false;
    ui.token.focus();
  }

  // ---- events ------------------------------------------------------------

  function mine(p) {
    return !p.sessionKey || canonical(p.sessionKey) === state.sessionKey;
  }

  function runEvent(name, p) {
    if (name === "chat") onChat(p);
    else if (name === "approval") onApproval(p);
    else onAgent(p);
  }

  function onChat(p) {
    if (!p.runId || !mine(p)) {
      if (p.state && p.state !== "delta") refreshSessionsSoon();
      return;
    }
    started(p.runId);
    const v = run(p.runId);
    v.started = true;
    // The end of a turn this page had not seen start (ANY_RUN): Stop goes
    // off. A command's answer is not a turn.
    if (p.state !== "delta" && !state.commands.has(p.runId)) {
      if (state.activeRun === ANY_RUN) setActive("");
      checkQueueSoon();
    }
    switch (p.state) {
      case "delta": {
        if (v.done) return;
        const full = textOf(p.message) || (v.text + (p.deltaText || ""));
        replyText(v, full, true);
        if (!state.activeRun) setActive(p.runId);
        break;
      }
      case "final": {
        const text = textOf(p.message);
        if (text || !v.reply) replyText(v, text || v.text, false);
        finishRun(v);
        refreshSessionsSoon();
        break;
      }
      case "aborted": {
        const partial = textOf(p.message);
        if (partial) replyText(v, partial, false);
        finishRun(v, true);
        notice("warning", p.errorMessage || "Stopped.", p.stopReason || "aborted", endOf(v), v.userText);
        refreshSessionsSoon();
        break;
      }
      case "error": {
        finishRun(v);
        notice("error", p.errorMessage || "Something went wrong.", p.stopReason || "error", endOf(v), v.userText);
        refreshSessionsSoon();
        break;
      }
      default: break;
    }
  }

  function onAgent(p) {
    if (!p.runId || !mine(p)) return;
    const v = run(p.runId);
    if (p.stream === "lifecycle" && (p.data || {}).phase === "start") {
      othersMessage(v, p.data.userText);
      started(p.runId);
      v.started = true;
    }
    const d = p.data || {};
    if (p.stream === "lifecycle") {
      if (d.phase === "start" && !v.done) setActive(p.runId);
      // The budget warning: once per turn, in words, before the stop.
      if (d.phase === "warning" && d.message && !v.done && !v.warned) {
        v.warned = true;
        notice("info", d.message, "", endOf(v));
      }
      return;
    }
    if (v.done) return;
    if (p.stream === "tool") {
      if (!d.toolCallId) return;
      const s = step(v, d.toolCallId, d.name);
      if (d.phase === "result") {
        setStepStatus(s, d.isError ? "failed" : "completed");
        setStepNote(s, "");
      } else {
        setStepStatus(s, "running");
      }
      if (!state.activeRun) setActive(p.runId);
      return;
    }
    if (p.stream === "item") {
      if (d.kind === "preamble") return;
      const id = d.toolCallId || d.itemId;
      if (!id) return;
      const s = step(v, id, d.name || (d.title && !d.title.includes(" ") ? d.title : ""));
      const ended = d.phase === "end" || d.status === "completed" || d.status === "failed";
      if (ended) {
        setStepStatus(s, d.status === "failed" ? "failed" : "completed");
        setStepNote(s, "");
        return;
      }
      // A title other than the step's own name is a notice about the step
      // ("⏳ Still working — shell has been running for 30s…"): it replaces
      // the line's note in place.
      const note = d.progressText || (d.title && d.title !== s.name ? d.title : "");
      setStepNote(s, note);
      if (d.status && d.status !== "running") setStepStatus(s, d.status);
    }
  }

  // ---- history and sessions ---------------------------------------------

  // loadHistory draws the session's history, then re-attaches to what is
  // happening in it now (turnguard.activeRun, turnguard.queue), then the run
  // events that arrived meanwhile. A run that ended meanwhile may or may not
  // be in the history already, so then the history is loaded again (twice at
  // most) rather than guessed.
  async function loadHistory(attempt) {
    const key = state.sessionKey;
    const loading = { key, held: [] };
    state.loading = loading;
    let res;
    try {
      res = await request("chat.history", { sessionKey: key, limit: 200 });
    } catch (err) {
      if (state.loading === loading) state.loading = null;
      if (key === state.sessionKey) notice("error", `Could not load the history: ${err.message}`);
      return;
    }
    if (state.loading !== loading || key !== state.sessionKey) return; // a newer load owns the page
    state.loading = null;
    const live = (res && res.turnguard) || {};
    const active = live.activeRun && !live.activeRun.stopping ? live.activeRun : null;
    const ended = loading.held.some(([name, p]) => name === "chat" && p.state !== "delta" &&
      (!active || p.runId !== active.runId) && !state.commands.has(p.runId));
    if (ended && (attempt || 0) < 2) return loadHistory((attempt || 0) + 1);

    ui.messages.replaceChildren();
    state.runs.clear();
    state.approvals.clear();
    state.queued.clear();
    setActive("");
    let lastUser = "";
    let turnBlock; // the block of the turn being drawn, from its first reply's turnguard
    const msgs = (res && res.messages) || [];
    const stopped = (m) => m && m.role === "assistant" && !!m.stopReason && m.stopReason !== "stop" && m.stopReason !== "end_turn";
    for (let i = 0; i < msgs.length; i++) {
      const m = msgs[i];
      const text = textOf(m);
      if (m.role === "user") { userMessage(text); lastUser = text; turnBlock = undefined; continue; }
      if (m.role !== "assistant") continue;
      // A finished turn's steps and settled cards, then its reply (and the
      // notice after a partial reply) in its block.
      const block = finishedTurn(m.turnguard) || turnBlock;
      turnBlock = block;
      if (!stopped(m)) {
        if (text) assistantMessage(text, block);
        continue;
      }
      // A turn that did not end normally: its partial reply (if any), then
      // the notice the user was shown, with Retry for the message before
      // it. Live, the gateway keeps them as two messages with the turn's
      // stop reason; reloaded from the store, as one: the partial reply, a
      // blank line, the notice. Nothing here depends on the notice's words
      // (they are configurable).
      const reason = m.stopReason;
      const next = msgs[i + 1];
      if (stopped(next) && next.stopReason === reason) { // the partial reply; the notice follows
        if (text) assistantMessage(text, block);
        continue;
      }
      let partial = "";
      let shown = text;
      const prev = msgs[i - 1];
      const cut = text.lastIndexOf("\n\n");
      if (!(stopped(prev) && prev.stopReason === reason) && cut >= 0) {
        partial = text.slice(0, cut);
        shown = text.slice(cut + 2);
      }
      if (partial) assistantMessage(partial, block);
      // A resumed turn's notice ("resuming it") offers no Retry: its next
      // attempt runs the request already.
      if (shown) notice(reason === "error" ? "error" : "warning", shown, reason, block, m.resumed ? "" : lastUser);
    }
    // Retry resends the running turn's own message (activeRun.userText), not
    // the history's last user message, which may have been steered into it.
    if (active) reattach(active, String(active.userText || lastUser));
    // The running turn's open questions, with their buttons.
    for (const a of live.approvals || []) {
      if (a && a.id && a.runId) approvalCard(a.runId, a, a.text);
    }
    // Each queued message is marked with the turn it will be answered in
    // (turnRunId: in collect mode the messages collected together share the
    // first's), so that turn's start marks them sent.
    for (const q of live.queue || []) {
      if (!q || !q.runId) continue;
      const turn = String(q.turnRunId || q.runId);
      const text = String(q.text || "");
      const bubble = userMessage(text);
      const v = run(turn); // Retry of that turn resends its messages (collect: joined)
      v.userText = v.userText ? `${v.userText}\n\n${text}` : text;
      markQueued(bubble, turn, String(q.busy || "queue"), Number(q.ahead) || 0, undefined, String(q.runId));
    }
    showWelcome();
    ui.messages.scrollTop = ui.messages.scrollHeight;
    for (const [name, p] of loading.held) runEvent(name, p);
  }

  // finishedTurn draws a finished turn's step lines and settled approval
  // cards as its live events drew them (chat.history's turnguard on the
  // turn's first reply) and returns the turn's block, where its reply goes;
  // undefined when the history says nothing of the turn.
  function finishedTurn(t) {
    if (!t || !t.runId) return undefined;
    const v = run(String(t.runId));
    for (const st of Array.isArray(t.steps) ? t.steps : []) {
      if (st && st.toolCallId) setStepStatus(step(v, String(st.toolCallId), String(st.name || "")), String(st.status || "completed"));
    }
    const more = Number(t.stepsOmitted) || 0;
    if (more > 0) v.steps.appendChild(el("div", "step step-more", `⋯ ${more} more step${more === 1 ? "" : "s"}`));
    for (const a of Array.isArray(t.approvals) ? t.approvals : []) {
      if (a && a.id) settleCard(approvalCard(v.id, a, a.text), a, a.text);
    }
    v.done = true;
    return v.block;
  }

  // reattach draws the session's running turn as chat.history describes it:
  // the last step completed, the step running (with the "still working"
  // notice when it is stalled), the reply so far, and turns Stop on for it.
  // Its later events carry the same tool ids, so they update these lines.
  function reattach(a, userText) {
    const v = run(String(a.runId));
    v.userText = userText;
    const last = a.lastStep;
    if (last && last.toolCallId) setStepStatus(step(v, last.toolCallId, last.name), "completed");
    const cur = a.currentStep;
    if (cur && cur.toolCallId) {
      const s = step(v, cur.toolCallId, cur.name);
      setStepStatus(s, a.paused ? "blocked" : "running");
      setStepNote(s, a.progressText || (a.paused ? "⏸️ waiting" : ""));
    }
    if (a.text) replyText(v, String(a.text), true); // the reply so far; its next delta carries it all
    setActive(v.id);
  }

  async function refreshSessions() {
    let rows = [];
    try {
      const res = await request("sessions.list", { limit: 50 });
      rows = (res && res.sessions) || [];
    } catch (_) { /* keep the current list */ }
    const keys = [];
    for (const r of rows) {
      if (r && r.key && !keys.includes(canonical(r.key))) keys.push(canonical(r.key));
    }
    if (!keys.includes(state.sessionKey)) keys.unshift(state.sessionKey);
    // Each session with how many messages its conversation has, so a /new
    // shows as a conversation that starts again.
    const counts = new Map(rows.filter((r) => r && r.key).map((r) => [canonical(r.key), Number(r.messages) || 0]));
    ui.session.replaceChildren();
    for (const k of keys) {
      const n = counts.get(k) || 0;
      const o = el("option", "", n ? `${shortKey(k)} \u00b7 ${n === 1 ? "1 message" : `${n} messages`}` : `${shortKey(k)} \u00b7 new`);
      o.value = k;
      o.selected = k === state.sessionKey;
      ui.session.appendChild(o);
    }
  }

  function refreshSessionsSoon() {
    clearTimeout(state.sessionsTimer);
    state.sessionsTimer = setTimeout(() => { if (state.connected) refreshSessions(); }, 300);
  }

  async function switchSession(key) {
    state.sessionKey = canonical(key);
    rememberSession(state.sessionKey);
    setActive("");
    ui.messages.replaceChildren();
    state.runs.clear();
    state.approvals.clear();
    await refreshSessions();
    await loadHistory();
    ui.input.focus();
  }

  // ---- user actions ------------------------------------------------------

  // COMMAND matches the conversation commands the gateway carries out
  // itself (docs/protocol.md, "Commands"): they start no turn, so the page
  // opens no run for them.
  const COMMAND = /^\s*\/(stop|status|new|help|start|queue)(\s|$)/i;

  // command sends a command through chat.send. Its answer in words arrives
  // as a chat final on its id (drawn by onChat); a /stop that stopped the
  // turn is answered by that turn's stop notice, which also ends the run's
  // view and the Stop button. fromButton: the Stop button sent it (no
  // bubble of a typed message; a failure says Stop failed).
  async function command(text, fromButton = false) {
    const id = uuid();
    state.commands.add(id);
    const bubble = fromButton ? null : userMessage(text);
    try {
      const res = await request("chat.send", { sessionKey: state.sessionKey, message: text, idempotencyKey: id });
      if (res && res.aborted === false && state.activeRun) {
        const v = state.runs.get(state.activeRun);
        if (v) finishRun(v); else setActive("");
      }
      // /stop and /new discard the session's queue (the answer's words say
      // how many): the queued messages here are dropped.
      if (res && res.ok !== false && /^\s*\/(stop|new)/i.test(text)) dropQueue();
      if (/^\s*\/new/i.test(text)) {
        if (bubble && res && res.ok !== false) clearBefore(bubble);
        refreshSessionsSoon();
      }
    } catch (err) {
      if (bubble) notSent(bubble, text);
      notice("error", fromButton ? `Stop failed: ${err.message}` : err.message);
      updateButtons();
    }
  }

  // clearBefore removes what is drawn above node (a /new: the earlier
  // conversation is forgotten, so it leaves the screen; the /new and its
  // answer stay) and forgets the runs and cards it removed.
  function clearBefore(node) {
    while (ui.messages.firstChild && ui.messages.firstChild !== node) ui.messages.firstChild.remove();
    for (const [id, v] of [...state.runs]) if (!v.block.isConnected) state.runs.delete(id);
    for (const [id, c] of [...state.approvals]) if (!c.card.isConnected) state.approvals.delete(id);
  }

  // notSent marks a message the gateway refused (busy, an error, a dropped
  // connection) and puts its text back in the textbox unless something new
  // was typed there meanwhile: what the user typed is never lost.
  function notSent(bubble, text) {
    setBubbleStatus(bubble, "not-sent", "not sent");
    if (!ui.input.value.trim()) {
      ui.input.value = text;
      ui.input.focus();
    }
  }

  async function send() {
    const text = ui.input.value;
    if (!text.trim() || !state.connected) return;
    ui.input.value = "";
    if (COMMAND.test(text)) return command(text);
    return sendText(text);
  }

  // sendText starts a turn with text (typed, or a Retry). While the
  // session's turn runs, the gateway may queue it (the bubble says so and
  // turns into the running turn when its run starts), hand it to the running
  // turn (steered), or refuse it (not sent: the text goes back).
  async function sendText(text) {
    const runId = uuid();
    const bubble = userMessage(text);
    const v = run(runId);
    v.userText = text;
    const before = state.activeRun;
    if (!before) setActive(runId); // Stop at once; a busy session keeps Stop on its running turn
    try {
      const ack = await request("chat.send", { sessionKey: state.sessionKey, message: text, idempotencyKey: runId });
      const status = ack && ack.status;
      if (status === "queued") {
        const id = ack.runId || runId;
        if (id !== runId) { // joined another message's follow-up turn (collect)
          v.block.remove();
          state.runs.delete(runId);
          const joined = run(id);
          joined.userText = joined.userText ? `${joined.userText}\n\n${text}` : text;
        }
        // Its run may have started already (the turn before it ended while
        // this answer was on its way): then it is simply sent.
        if (!run(id).started) {
          if (state.activeRun === runId) setActive(before || ANY_RUN);
          markQueued(bubble, id, ack.fellBack ? "steer" : ack.busy, Number(ack.ahead) || 0, ack.text, runId);
        }
        if (Array.isArray(ack.dropped)) dropQueued(ack.dropped.map(String));
      } else if (status === "started" && ack.runId && ack.runId !== runId) {
        // Joined a burst being merged into one turn (busy.debounceMs): that
        // turn's events carry the first message's run id.
        v.block.remove();
        state.runs.delete(runId);
        if (state.activeRun === runId) setActive(before || ack.runId);
        const joined = run(ack.runId);
        joined.userText = joined.userText ? `${joined.userText}\n\n${text}` : text;
      } else if (status === "steered") {
        v.block.remove();
        state.runs.delete(runId);
        if (state.activeRun === runId) setActive(before || ack.runId);
        setBubbleStatus(bubble, "steered", "Added to the running request", ack.text);
      } else if (status && status !== "started" && status !== "in_flight" && !v.done) {
        // Terminal at once (a repeated key): the history has the outcome.
        finishRun(v);
        await loadHistory();
      }
    } catch (err) {
      // Refused: no turn started. Drop its empty view, give Stop back to
      // the turn that is running (a busy session names it), keep the text.
      finishRun(v);
      v.block.remove();
      state.runs.delete(runId);
      const busy = (err.info && err.info.details && err.info.details.runId) || before;
      const other = busy && state.runs.get(busy);
      if (state.activeRun === "" && busy && !(other && other.done)) setActive(busy);
      notSent(bubble, text);
      notice("error", err.message);
    }
  }

  // stop is the Stop button: it does what typing /stop does — the
  // session's turn stops and its queued messages are dropped (the answer
  // says how many). chat.abort, which stops one run and keeps the queue,
  // stays for other OpenClaw clients.
  async function stop() {
    ui.stop.disabled = true;
    await command("/stop", true);
  }

  // ---- command suggestions ------------------------------------------------

  // While the textbox holds "/" and a command name being typed (no space
  // yet), the session's commands (commands.list: the gateway's, then the
  // agent's) whose names start with it are listed above it; a click, Tab or
  // Enter on one fills "/name ", Escape closes the list. The list is asked
  // once per "/" typed at the start, so a turn that changed the agent's
  // commands shows at the next one.
  function suggestions() {
    const key = state.sessionKey;
    if (!state.suggestions || state.suggestions.key !== key) {
      const list = request("commands.list", { sessionKey: key }).then((r) => r.commands || [], () => []);
      state.suggestions = { key, list };
    }
    return state.suggestions.list;
  }

  function hideSuggestions() {
    ui.suggest.hidden = true;
    ui.suggest.replaceChildren();
  }

  async function suggest() {
    const m = /^\/([a-z0-9_]*)$/i.exec(ui.input.value);
    if (!m || !state.connected) { hideSuggestions(); return; }
    if (ui.input.value === "/") state.suggestions = null; // asked anew each time a command starts
    const list = (await suggestions()).filter((c) => c.name.startsWith(m[1].toLowerCase()));
    if (ui.input.value !== "/" + m[1]) return; // typed on meanwhile: the next input event shows it
    if (list.length === 0) { hideSuggestions(); return; }
    state.picked = Math.min(state.picked, list.length - 1);
    ui.suggest.replaceChildren(...list.map((c, i) => {
      const li = el("li");
      li.setAttribute("role", "option");
      li.setAttribute("aria-selected", String(i === state.picked));
      li.dataset.name = c.name;
      li.append(el("span", "name", "/" + c.name), el("span", "desc", c.description));
      li.addEventListener("mousedown", (e) => { e.preventDefault(); pick(c.name); });
      return li;
    }));
    ui.suggest.hidden = false;
  }

  function pick(name) {
    ui.input.value = `/${name} `;
    hideSuggestions();
    ui.input.focus();
  }

  // moveSuggestion handles the keys of an open list; true when it took the key.
  function moveSuggestion(e) {
    const items = [...ui.suggest.children];
    if (ui.suggest.hidden || items.length === 0) return false;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      state.picked = (state.picked + (e.key === "ArrowDown" ? 1 : items.length - 1)) % items.length;
      items.forEach((li, i) => li.setAttribute("aria-selected", String(i === state.picked)));
      items[state.picked].scrollIntoView({ block: "nearest" });
    } else if (e.key === "Tab" || (e.key === "Enter" && !e.shiftKey && !e.isComposing)) {
      const name = items[state.picked].dataset.name;
      if (e.key === "Enter" && ui.input.value.toLowerCase() === "/" + name) { hideSuggestions(); return false; } // typed whole: send it
      pick(name);
    } else if (e.key === "Escape") {
      hideSuggestions();
    } else {
      return false;
    }
    e.preventDefault();
    return true;
  }

  ui.composer.addEventListener("submit", (e) => { e.preventDefault(); hideSuggestions(); send(); });
  ui.input.addEventListener("input", () => { state.picked = 0; suggest(); });
  ui.input.addEventListener("blur", hideSuggestions);
  ui.input.addEventListener("keydown", (e) => {
    if (moveSuggestion(e)) return;
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); hideSuggestions(); send(); }
  });
  ui.stop.addEventListener("click", stop);
  ui.session.addEventListener("change", () => switchSession(ui.session.value));
  ui.newSession.addEventListener("click", () => switchSession(`web-${uuid().slice(0, 8)}`));
  ui.tokenForm.addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = ui.token.value.trim();
    ui.token.value = "";
    try { sessionStorage.setItem("turnguard.token", state.token); } catch (_) { /* storage off */ }
    state.stopReconnect = false;
    ui.tokenForm.hidden = true;
    connect();
  });

  // A token added to the address of an open page ("#token=…") is taken at
  // once: the page connects again with it, no reload needed.
  window.addEventListener("hashchange", () => {
    if (!new URLSearchParams(location.hash.replace(/^#/, "")).get("token")) return;
    state.token = takeToken();
    state.stopReconnect = false;
    ui.tokenForm.hidden = true;
    const old = state.ws;
    state.ws = null;
    state.connected = false;
    for (const p of state.pending.values()) p.reject(new Error("connection closed"));
    state.pending.clear();
    updateButtons();
    if (old) old.close();
    connect();
  });

  // The Markdown renderer, for the end-to-end tests (a reply from the demo
  // runner is one line, so lists and fences are checked through this).
  Object.defineProperty(window, "turnguard", { value: Object.freeze({ renderMarkdown }) });

  rememberSession(state.sessionKey);
  state.device = loadDevice();
  showWelcome();
  connect();
})();
