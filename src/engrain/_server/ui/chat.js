// engrain web UI: LLM agents and their chat sessions (POST /api/agents/{name}/chat streams SSE).
// Loaded before app.js, which routes #/chat and #/chat/<agent> here. Text only, never innerHTML.
"use strict";

window.engrainChat = (() => {
  const { h, badge, short, setStatus, errorBox, table, token, api, enc } = window.engrainUI;

  async function agentsView() {
    const [all, options] = await Promise.all([api("GET", "/api/agents"), api("GET", "/api/agents/options")]);
    const agents = all.filter((a) => a.kind === "llm");
    const lacks = (model) => {
      const p = (options.providers || []).find((x) => x.name === String(model || "").split(":")[0]);
      return p ? p.missing_key : null;
    };
    const rows = agents.map((a) => h("tr", { "data-agent": a.name },
      h("td", {}, h("a", { href: `#/chat/${enc(a.name)}`, text: a.name })),
      h("td", {}, h("span", { class: "mono", text: a.model }),
        lacks(a.model) ? [" ", badge(`no ${lacks(a.model)}`, "warning")] : null),
      h("td", { text: (a.tools || []).join(", ") || "—" }),
      h("td", { text: short(a.instructions || "", 100) || "—" })));
    return [
      h("h1", { text: "Chat with an agent" }),
      agents.length
        ? table(["Agent", "Model", "Tools", "Instructions"], rows)
        : h("p", { class: "muted", text: "No LLM agents yet: create one below." }),
      createForm(options, lacks),
    ];
  }

  /** The form that creates an LLM agent (POST /api/agents); it says when the server lacks the model's key. */
  function createForm(options, lacks) {
    const providers = options.providers || [];
    const name = h("input", { id: "agent-name", name: "name", required: true, pattern: "[A-Za-z_][A-Za-z0-9_.\\-]{0,63}",
      "aria-describedby": "agent-name-hint" });
    const model = h("input", { id: "agent-model", name: "model", required: true, list: "agent-models",
      value: (providers[0] && providers[0].example) || "", "aria-describedby": "agent-model-key" });
    const keyNote = h("p", { id: "agent-model-key", class: "notice", role: "status", hidden: true });
    const showKey = () => {
      const env = lacks(model.value);
      const provider = model.value.split(":")[0];
      keyNote.hidden = !env;
      keyNote.textContent = env
        ? `The server has no ${env}: an agent on ${provider} can be created, but it cannot answer until the server is restarted with ${env} set.`
        : "";
    };
    model.addEventListener("input", showKey);
    const instructions = h("textarea", { id: "agent-instructions", name: "instructions", rows: "3" });
    const tools = options.tools || [];
    const boxes = tools.map((t, i) => ({ t, box: h("input", { type: "checkbox", id: `agent-tool-${i}`, name: "tools", value: t.name,
      disabled: t.kind === "unusable" }) }));
    const out = h("div", { "aria-live": "polite" });
    const submit = h("button", { type: "submit", text: "Create agent" });
    const form = h("form", {
      class: "agent-form", id: "create-agent", "aria-labelledby": "create-agent-title",
      onsubmit: async (e) => {
        e.preventDefault();
        submit.disabled = true;
        out.replaceChildren();
        try {
          const made = await api("POST", "/api/agents", {
            name: name.value.trim(), model: model.value.trim(), instructions: instructions.value,
            tools: boxes.filter((b) => b.box.checked).map((b) => b.t.name),
          });
          setStatus(made.warning ? `Agent ${made.name} created. ${made.warning}` : `Agent ${made.name} created.`, Boolean(made.warning));
          location.hash = `#/chat/${enc(made.name)}`;
        } catch (err) {
          out.replaceChildren(errorBox(err));
          submit.disabled = false;
        }
      },
    },
    h("div", { class: "field" }, h("label", { for: "agent-name", text: "Name" }), name,
      h("span", { class: "hint", id: "agent-name-hint", text: "letters, digits, _ . - (at most 64)" })),
    h("div", { class: "field" }, h("label", { for: "agent-model", text: "Model" }), model,
      h("datalist", { id: "agent-models" }, providers.map((p) => h("option", { value: p.example })))),
    keyNote,
    h("div", { class: "field" }, h("label", { for: "agent-instructions", text: "Instructions" }), instructions),
    h("fieldset", {}, h("legend", { text: "Tools" }),
      boxes.length
        ? boxes.map(({ t, box }) => h("div", { class: "field check" }, box,
          h("label", { for: box.id }, h("span", { class: "mono", text: t.name }), " ", badge(t.kind, t.kind === "unusable" ? "error" : "muted"),
            h("span", { class: "hint", text: ` ${short(t.description || "", 100)}` }))))
        : h("p", { class: "muted", text: "This server has no tools (start it with --tools module:registry or --tools-dir DIR)." })),
    submit, out);
    showKey();
    return h("section", { class: "panel" }, h("h2", { id: "create-agent-title", text: "Create an agent" }), form);
  }

  function tsLabel(ts) {
    return ts ? h("time", { datetime: ts, class: "muted", text: ts.slice(0, 19).replace("T", " ") + " UTC" }) : null;
  }

  function bubble(role, text, ts) {
    const body = h("div", { class: "content", text: text || "" });
    const el = h("li", { class: `msg ${role}`, "data-role": role },
      h("div", { class: "head" }, h("strong", { text: role === "user" ? "You" : "Agent" }), tsLabel(ts)), body);
    return { el, body };
  }

  function toolItem(call) {
    const result = h("pre", { class: "tool-result", text: "…" });
    const el = h("li", { class: "msg tool", "data-tool": call.name },
      h("details", { open: true },
        h("summary", {}, "tool call ", h("span", { class: "mono", text: call.name }), " ",
          h("span", { class: "mono muted", text: short(call.arguments || "{}", 120) })),
        result));
    return { el, result };
  }

  function showResult(item, r) {
    item.result.textContent = r.content;
    if (r.error) item.el.appendChild(badge("error"));
  }

  /** POST a message and call onEvent(e) for each SSE event of the reply. */
  async function streamChat(agent, session, message, onEvent) {
    const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
    if (token()) headers.Authorization = `Bearer ${token()}`;
    const resp = await fetch(`/api/agents/${enc(agent)}/chat`, {
      method: "POST", headers, body: JSON.stringify({ session, message }),
    });
    if (!resp.ok) {
      let err = {};
      try { err = await resp.json(); } catch (e) { /* not JSON */ }
      throw new Error(`${err.error || "HTTP " + resp.status}: ${err.detail || resp.statusText}`);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (data) onEvent(JSON.parse(data));
      }
    }
  }

  function newSession() {
    return `web-${Date.now().toString(36)}`;
  }

  async function chatView(agentName, params) {
    const session = params.get("session") || newSession();
    if (!params.get("session")) history.replaceState(null, "", `#/chat/${enc(agentName)}?session=${enc(session)}`);
    const [agents, past, options] = await Promise.all([
      api("GET", "/api/agents"),
      api("GET", `/api/agents/${enc(agentName)}/sessions/${enc(session)}`),
      api("GET", "/api/agents/options"),
    ]);
    const agent = agents.find((a) => a.kind === "llm" && a.name === agentName);
    if (!agent) throw new Error(`no LLM agent named ${agentName}`);
    const log = h("ol", { class: "chat-log", id: "chat-log", "aria-live": "polite", "aria-label": "Conversation" });
    const tools = new Map();
    for (const m of past) {
      if (m.role === "user" || (m.role === "assistant" && m.content)) log.appendChild(bubble(m.role, m.content, m.ts).el);
      for (const c of (m.role === "assistant" && m.tool_calls) || []) {
        const item = toolItem(c);
        tools.set(c.id, item);
        log.appendChild(item.el);
      }
      if (m.role === "tool" && tools.has(m.tool_call_id)) showResult(tools.get(m.tool_call_id), m);
    }
    const input = h("textarea", { id: "chat-input", name: "message", rows: "2", required: true, placeholder: "Message" });
    const send = h("button", { type: "submit", text: "Send" });
    const form = h("form", {
      class: "chat-form", "aria-label": `Message ${agentName}`,
      onsubmit: async (e) => {
        e.preventDefault();
        const message = input.value.trim();
        if (!message) return;
        input.value = "";
        send.disabled = true;
        log.appendChild(bubble("user", message, new Date().toISOString()).el);
        let current = null;
        try {
          await streamChat(agentName, session, message, (ev) => {
            if (ev.type === "text") {
              if (!current) {
                current = bubble("assistant", "", new Date().toISOString());
                log.appendChild(current.el);
              }
              current.body.textContent += ev.delta;
            } else if (ev.type === "tool_call") {
              current = null;
              const item = toolItem(ev);
              tools.set(ev.id, item);
              log.appendChild(item.el);
            } else if (ev.type === "tool_result" && tools.has(ev.id)) {
              showResult(tools.get(ev.id), ev);
            } else if (ev.type === "error") {
              log.appendChild(h("li", { class: "msg" }, errorBox(new Error(ev.error))));
            } else if (ev.type === "done") {
              setStatus(ev.status === "ok" ? `Reply done (run ${ev.run_id}).` : `The turn ${ev.status}.`, ev.status !== "ok");
            }
          });
        } catch (err) {
          log.appendChild(h("li", { class: "msg" }, errorBox(err)));
        } finally {
          send.disabled = false;
          input.focus();
        }
      },
    }, h("label", { for: "chat-input", class: "visually-hidden", text: "Message" }), input, send);
    const provider = (options.providers || []).find((p) => p.name === agent.model.split(":")[0]);
    const env = provider && provider.missing_key;
    return [
      h("h1", { text: `Chat: ${agentName}` }),
      env ? h("p", { class: "notice", id: "model-key-missing", role: "alert",
        text: `The server has no ${env}: this agent cannot answer until the server is restarted with ${env} set in its environment.` }) : null,
      h("p", { class: "muted" }, h("span", { class: "mono", text: agent.model }), ` · session ${session} · `,
        h("a", { href: `#/chat/${enc(agentName)}?session=${enc(newSession())}`, text: "new session" })),
      log,
      form,
    ];
  }

  return { agentsView, chatView };
})();
