// The ACP test agent of runner/acp's tests: a real agent on the official
// SDK (@agentclientprotocol/sdk, AgentSideConnection over stdio), scripted
// by the prompt text. It runs its "tools" for real (files through the
// client's fs methods, permission through session/request_permission).
//
//   remember X        keeps X in the session; "what did I say" tells it back
//   pid               answers with its process id
//   logout            forgets the sign-in (ACP_TEST_AUTH): "logged out"
//   whoami            "signed in N times" (authenticate calls that worked)
//   cwd               answers with the session's cwd
//   tool echo X       a tool call "Echo X" that completes, then "echoed X"
//   tool hang         a tool call "Run slow_tool" that never completes;
//                     honours session/cancel (stopReason cancelled)
//   hang ignore cancel  never answers, ignores session/cancel
//   ask permission    asks to run "Delete build/"; runs it when allowed
//   elicit K          elicitation/create of kind K — color (one string
//                     field of 3 choices), confirm (one boolean field),
//                     ok (no field), name (a free-text field), link (url
//                     mode) — then "elicited <the result as JSON>"
//   write file P C    fs/write_text_file P with content C
//   read file P       fs/read_text_file P
//   settings          "model M verbose V": the session's config options
//                     (session/new offers "model", a select, and
//                     "verbose", a boolean; session/set_config_option sets
//                     them)
//   think             a thought and a plan, then "thought done"
//   stop R            ends the turn with stopReason R after some text
//   error             answers session/prompt with a JSON-RPC error
//   crash             some text, then exits with status 3
//   garbage           prints non-JSON lines, then "after garbage"
//   huge line         prints an 11 MB line
//   stderr            writes to stderr, then "stderr written"
//   plan              a plan of 5 entries (the 1st completed, the 2nd "Run
//                     tests" in progress), then "planned"
//   plan hang         the same plan, then waits for session/cancel
//   terminal run [limit N] C  runs sh -c C in a terminal (env ACP_TEST_VAR,
//                     outputByteLimit N), waits, then "exit E truncated T
//                     output "O"" (or "refused: <error>")
//   terminal kill     sleep 600 in a terminal, terminal/kill, then
//                     "killed: exit E signal S"
//   terminal many N   creates N terminals at once, releases them, creates
//                     one more: "made M, error: <the last refusal>"
//   terminal hang     a terminal printing its shell's pid, then nothing:
//                     "pid P", then waits for session/cancel
//   anything else     "echo: <text>"
//
// Sessions outlive the process when ACP_TEST_SESSIONS names a directory:
// each session is a file there (its cwd, memory and history), written
// after every turn. ACP_TEST_CAPS lists what initialize advertises,
// comma-separated: "load" (loadSession: session/load replays the history
// as session/update notifications, then answers), "resume"
// (sessionCapabilities.resume), "close" (sessionCapabilities.close) and
// "list" (sessionCapabilities.list: session/list lists this process's
// sessions, titled by their first message).
// Every session/load, session/resume and session/close is appended to
// ACP_TEST_SESSIONS/calls.log as "<method> <sessionId>".
import * as acp from "@agentclientprotocol/sdk";
import * as fs from "node:fs";
import * as path from "node:path";
import { Readable, Writable } from "node:stream";

const dir = process.env.ACP_TEST_SESSIONS || "";
const caps = new Set((process.env.ACP_TEST_CAPS || "").split(",").filter(Boolean));
// ACP_TEST_AUTH=1: the agent lists the auth methods "test-login" (which
// works) and "broken-login" (which fails), and refuses session/new and
// session/prompt with auth_required until authenticate succeeded.
const needsAuth = process.env.ACP_TEST_AUTH === "1";

function sessionFile(id) {
  if (!dir || !/^[A-Za-z0-9-]+$/.test(id)) return "";
  return path.join(dir, `${id}.json`);
}

function logCall(method, id) {
  if (dir) fs.appendFileSync(path.join(dir, "calls.log"), `${method} ${id}\n`);
}

class TestAgent {
  constructor(conn) {
    this.conn = conn;
    this.sessions = new Map();
    this.n = 0;
    this.authed = !needsAuth;
    this.signIns = 0;
  }

  async initialize() {
    return {
      protocolVersion: acp.PROTOCOL_VERSION,
      agentCapabilities: {
        loadSession: caps.has("load"),
        sessionCapabilities: {
          ...(caps.has("resume") ? { resume: {} } : {}),
          ...(caps.has("close") ? { close: {} } : {}),
          ...(caps.has("list") ? { list: {} } : {}),
        },
      },
      agentInfo: { name: "test-agent", version: "1.0.0" },
      authMethods: needsAuth
        ? [
            { id: "test-login", name: "Test login" },
            { id: "broken-login", name: "Broken login" },
          ]
        : [],
    };
  }

  // session/list (ACP_TEST_CAPS "list"): the sessions of this process in
  // params.cwd, oldest first, titled by their first message.
  async listSessions(params) {
    const sessions = [];
    for (const [sessionId, s] of this.sessions) {
      if (params.cwd && s.cwd !== params.cwd) continue;
      sessions.push({ sessionId, cwd: s.cwd, title: s.history.length ? s.history[0].text : null });
    }
    return { sessions };
  }

  async authenticate(params) {
    if (params.methodId !== "test-login") throw acp.RequestError.internalError(undefined, "login server unreachable");
    this.authed = true;
    this.signIns++;
    return {};
  }

  async newSession(params) {
    if (!this.authed) throw acp.RequestError.authRequired();
    const sessionId = `s${++this.n}-${process.pid}`;
    this.sessions.set(sessionId, { cwd: params.cwd, memory: null, abort: null, history: [], mode: "ask" });
    // The session's slash commands follow its creation (as agents do).
    setImmediate(() =>
      this.conn.sessionUpdate({
        sessionId,
        update: {
          sessionUpdate: "available_commands_update",
          availableCommands: [
            { name: "echo", description: "Say the input back", input: { hint: "text to echo" } },
            { name: "mode", description: "Which mode the session is in" },
          ],
        },
      }),
    );
    return { sessionId, modes: this.modes("ask"), configOptions: this.configOptions(this.sessions.get(sessionId)) };
  }

  // configOptions is the configOptions of session s: a select "model"
  // (fast or smart, in two groups) and a boolean "verbose".
  configOptions(s) {
    s.config ??= { model: "fast", verbose: false };
    return [
      {
        id: "model",
        name: "Model",
        type: "select",
        category: "model",
        currentValue: s.config.model,
        options: [
          { group: "quick", name: "Quick", options: [{ value: "fast", name: "Fast" }] },
          { group: "deep", name: "Deep", options: [{ value: "smart", name: "Smart" }] },
        ],
      },
      { id: "verbose", name: "Verbose", type: "boolean", currentValue: s.config.verbose },
    ];
  }

  async setSessionConfigOption(params) {
    const s = this.sessions.get(params.sessionId);
    if (!s) throw acp.RequestError.invalidParams(`no session ${params.sessionId}`);
    this.configOptions(s);
    if (params.configId === "model" && ["fast", "smart"].includes(params.value)) s.config.model = params.value;
    else if (params.configId === "verbose" && typeof params.value === "boolean") s.config.verbose = params.value;
    else throw acp.RequestError.invalidParams(`no option ${params.configId}=${params.value}`);
    return { configOptions: this.configOptions(s) };
  }

  // modes is the SessionModeState of a session in mode current.
  modes(current) {
    return {
      currentModeId: current,
      availableModes: [
        { id: "ask", name: "Ask", description: "Answer questions without changing anything" },
        { id: "code", name: "Code", description: "Write and run code" },
      ],
    };
  }

  async setSessionMode(params) {
    const s = this.sessions.get(params.sessionId);
    if (!s) throw acp.RequestError.invalidParams(`no session ${params.sessionId}`);
    if (!["ask", "code"].includes(params.modeId)) throw acp.RequestError.invalidParams(`no mode ${params.modeId}`);
    s.mode = params.modeId;
    this.save(params.sessionId);
    await this.conn.sessionUpdate({
      sessionId: params.sessionId,
      update: { sessionUpdate: "current_mode_update", currentModeId: params.modeId },
    });
    return {};
  }

  // restore reads session id from its file into this process, or throws.
  restore(id, method) {
    logCall(method, id);
    const f = sessionFile(id);
    if (!this.sessions.has(id)) {
      if (!f || !fs.existsSync(f)) throw acp.RequestError.resourceNotFound(id);
      const saved = JSON.parse(fs.readFileSync(f, "utf8"));
      this.sessions.set(id, { cwd: saved.cwd, memory: saved.memory, abort: null, history: saved.history, mode: saved.mode });
    }
    return this.sessions.get(id);
  }

  save(id) {
    const f = sessionFile(id);
    const s = this.sessions.get(id);
    if (f && s) fs.writeFileSync(f, JSON.stringify({ cwd: s.cwd, memory: s.memory, history: s.history, mode: s.mode }));
  }

  async loadSession(params) {
    const s = this.restore(params.sessionId, "session/load");
    for (const h of s.history) {
      const kind = h.role === "user" ? "user_message_chunk" : "agent_message_chunk";
      await this.conn.sessionUpdate({
        sessionId: params.sessionId,
        update: { sessionUpdate: kind, content: { type: "text", text: h.text } },
      });
    }
    return { modes: this.modes(s.mode ?? "ask") };
  }

  async resumeSession(params) {
    const s = this.restore(params.sessionId, "session/resume");
    return { modes: this.modes(s.mode ?? "ask") };
  }

  async closeSession(params) {
    logCall("session/close", params.sessionId);
    this.sessions.get(params.sessionId)?.abort?.abort();
    this.sessions.delete(params.sessionId);
    return {};
  }

  async cancel(params) {
    this.sessions.get(params.sessionId)?.abort?.abort();
  }

  async say(sessionId, text) {
    this.sessions.get(sessionId)?.history.push({ role: "agent", text });
    await this.conn.sessionUpdate({
      sessionId,
      update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
    });
  }

  async tool(sessionId, toolCallId, title, kind, status) {
    await this.conn.sessionUpdate({
      sessionId,
      update: { sessionUpdate: "tool_call", toolCallId, title, kind, status, rawInput: {} },
    });
  }

  async toolDone(sessionId, toolCallId, status, text) {
    await this.conn.sessionUpdate({
      sessionId,
      update: {
        sessionUpdate: "tool_call_update",
        toolCallId,
        status,
        content: [{ type: "content", content: { type: "text", text } }],
      },
    });
  }

  async prompt(params) {
    const sid = params.sessionId;
    const s = this.sessions.get(sid);
    if (!s) throw acp.RequestError.invalidParams(`no session ${sid}`);
    if (!this.authed) throw acp.RequestError.authRequired();
    s.abort = new AbortController();
    const cancelled = new Promise((resolve) => s.abort.signal.addEventListener("abort", resolve));
    const text = params.prompt.filter((b) => b.type === "text").map((b) => b.text).join("").trim();
    s.history.push({ role: "user", text });
    try {
      return await this.turn(sid, s, text, cancelled);
    } finally {
      this.save(sid);
    }
  }

  async turn(sid, s, text, cancelled) {
    let m;
    if ((m = text.match(/^\/echo (.*)$/))) {
      await this.say(sid, `echo: ${m[1]}`);
    } else if (text === "/mode") {
      await this.say(sid, `mode ${s.mode}`);
    } else if (text === "settings") {
      this.configOptions(s);
      await this.say(sid, `model ${s.config.model} verbose ${s.config.verbose}`);
    } else if ((m = text.match(/^remember (.*)$/))) {
      s.memory = m[1];
      await this.say(sid, `OK, I will remember ${m[1]}.`);
    } else if (text === "what did I say") {
      await this.say(sid, s.memory ? `You said: ${s.memory}` : "You said nothing yet.");
    } else if (text === "logout") {
      this.authed = !needsAuth;
      await this.say(sid, "logged out");
    } else if (text === "whoami") {
      await this.say(sid, `signed in ${this.signIns} times`);
    } else if (text === "pid") {
      await this.say(sid, `pid ${process.pid}`);
    } else if (text === "cwd") {
      await this.say(sid, `cwd ${s.cwd}`);
    } else if ((m = text.match(/^tool echo (.*)$/))) {
      await this.tool(sid, "echo-1", `Echo ${m[1]}`, "other", "in_progress");
      await this.toolDone(sid, "echo-1", "completed", m[1]);
      await this.say(sid, `echoed ${m[1]}`);
    } else if (text === "tool hang") {
      await this.say(sid, "Starting the slow tool. ");
      await this.tool(sid, "slow-1", "Run slow_tool", "execute", "in_progress");
      await cancelled;
      await this.toolDone(sid, "slow-1", "failed", "cancelled");
      return { stopReason: "cancelled" };
    } else if (text === "hang ignore cancel") {
      await this.say(sid, "Ignoring you. ");
      await new Promise(() => {});
    } else if (text === "ask permission") {
      const call = { toolCallId: "del-1", title: "Delete build/", kind: "delete", rawInput: { path: "build/" } };
      await this.tool(sid, "del-1", "Delete build/", "delete", "pending");
      const res = await Promise.race([
        this.conn.requestPermission({
          sessionId: sid,
          toolCall: call,
          options: [
            { optionId: "yes", name: "Allow once", kind: "allow_once" },
            { optionId: "no", name: "Reject", kind: "reject_once" },
          ],
        }),
        cancelled.then(() => ({ outcome: { outcome: "cancelled" } })),
      ]);
      if (res.outcome.outcome === "cancelled") {
        await this.toolDone(sid, "del-1", "failed", "cancelled");
        return { stopReason: "cancelled" };
      }
      if (res.outcome.optionId === "yes") {
        await this.toolDone(sid, "del-1", "completed", "deleted 3 files");
        await this.say(sid, "Tool output: deleted 3 files");
      } else {
        await this.toolDone(sid, "del-1", "failed", "denied");
        await this.say(sid, `Permission denied (${res.outcome.optionId}).`);
      }
    } else if ((m = text.match(/^elicit (\S+)$/))) {
      const forms = {
        color: { type: "object", properties: { color: { type: "string", title: "Color", enum: ["red", "green", "blue"] } }, required: ["color"] },
        confirm: { type: "object", properties: { sure: { type: "boolean", title: "Deploy to production?" } } },
        ok: { type: "object", properties: {} },
        name: { type: "object", properties: { name: { type: "string", title: "Your name" } } },
      };
      const params =
        m[1] === "link"
          ? { sessionId: sid, mode: "url", message: "Sign in to the tracker", url: "https://tracker.example/login?code=42", elicitationId: "el-1" }
          : { sessionId: sid, mode: "form", message: `Pick a ${m[1]}`, requestedSchema: forms[m[1]] };
      const res = await Promise.race([this.conn.createElicitation(params), cancelled.then(() => null)]);
      if (res === null) return { stopReason: "cancelled" };
      await this.say(sid, `elicited ${JSON.stringify(res)}`);
    } else if ((m = text.match(/^write file (\S+) (.*)$/))) {
      try {
        await this.conn.writeTextFile({ sessionId: sid, path: m[1], content: m[2] });
        await this.say(sid, `wrote ${m[1]}`);
      } catch (e) {
        await this.say(sid, `refused: ${e.message}`);
      }
    } else if ((m = text.match(/^read file (\S+)$/))) {
      try {
        const r = await this.conn.readTextFile({ sessionId: sid, path: m[1] });
        await this.say(sid, `content: ${r.content}`);
      } catch (e) {
        await this.say(sid, `refused: ${e.message}`);
      }
    } else if (text === "think") {
      await this.conn.sessionUpdate({
        sessionId: sid,
        update: { sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "hmm, thinking" } },
      });
      await this.conn.sessionUpdate({
        sessionId: sid,
        update: { sessionUpdate: "plan", entries: [{ content: "answer", priority: "high", status: "pending" }] },
      });
      await this.say(sid, "thought done");
    } else if (text === "plan" || text === "plan hang") {
      const entries = ["Read the code", "Run tests", "Fix the bug", "Run tests again", "Commit"].map((content, i) => ({
        content,
        priority: "medium",
        status: i === 0 ? "completed" : i === 1 ? "in_progress" : "pending",
      }));
      await this.conn.sessionUpdate({ sessionId: sid, update: { sessionUpdate: "plan", entries } });
      if (text === "plan hang") {
        await cancelled;
        return { stopReason: "cancelled" };
      }
      await this.say(sid, "planned");
    } else if ((m = text.match(/^stop (\S+)$/))) {
      await this.say(sid, "partial answer");
      return { stopReason: m[1] };
    } else if (text === "error") {
      throw new acp.RequestError(-32000, "quota exhausted for today");
    } else if (text === "crash") {
      await this.say(sid, "about to crash");
      setTimeout(() => process.exit(3), 50);
      await new Promise(() => {});
    } else if (text === "garbage") {
      for (let i = 0; i < 1000; i++) process.stdout.write(`this is not json ${i}\n`);
      process.stdout.write("{\"not\": \"json-rpc\"}\n");
      await this.say(sid, "after garbage");
    } else if (text === "huge line") {
      process.stdout.write("x".repeat(11 << 20) + "\n");
      await new Promise(() => {});
    } else if (text === "stderr") {
      process.stderr.write("agent diagnostics: all fine\n");
      await this.say(sid, "stderr written");
    } else if ((m = text.match(/^terminal run(?: limit (\d+))? (.*)$/))) {
      try {
        const t = await this.conn.createTerminal({
          sessionId: sid, command: "sh", args: ["-c", m[2]], env: [{ name: "ACP_TEST_VAR", value: "from-agent" }],
          ...(m[1] ? { outputByteLimit: Number(m[1]) } : {}),
        });
        const st = await t.waitForExit();
        const out = await t.currentOutput();
        await t.release();
        await this.say(sid, `exit ${st.exitCode} truncated ${out.truncated} output ${JSON.stringify(out.output)}`);
      } catch (e) {
        await this.say(sid, `refused: ${e.message}`);
      }
    } else if (text === "terminal kill") {
      const t = await this.conn.createTerminal({ sessionId: sid, command: "sleep", args: ["600"] });
      await t.kill();
      const st = await t.waitForExit();
      await t.release();
      await this.say(sid, `killed: exit ${st.exitCode} signal ${st.signal}`);
    } else if ((m = text.match(/^terminal many (\d+)$/))) {
      const made = [];
      let err = "none";
      for (let i = 0; i < Number(m[1]); i++) {
        try {
          made.push(await this.conn.createTerminal({ sessionId: sid, command: "sleep", args: ["600"] }));
        } catch (e) {
          err = e.message;
        }
      }
      for (const t of made) await t.release();
      const again = await this.conn.createTerminal({ sessionId: sid, command: "true" });
      await again.release();
      await this.say(sid, `made ${made.length}, error: ${err}`);
    } else if (text === "terminal hang") {
      // A command that prints its pid and then nothing: the pid goes to
      // the reply, and the turn waits for session/cancel.
      const t = await this.conn.createTerminal({ sessionId: sid, command: "sh", args: ["-c", "echo $$; exec sleep 600"] });
      let out = "";
      while (!out.includes("\n")) {
        out = (await t.currentOutput()).output;
        await new Promise((r) => setTimeout(r, 10));
      }
      await this.say(sid, `pid ${out.trim()}`);
      await cancelled;
      return { stopReason: "cancelled" };
    } else {
      await this.say(sid, `echo: ${text}`);
    }
    s.abort = null;
    return { stopReason: "end_turn" };
  }
}

const stream = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
new acp.AgentSideConnection((conn) => new TestAgent(conn), stream);
