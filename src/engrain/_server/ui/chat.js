// engrain web UI: LLM agents and their chat sessions (POST /api/agents/{name}/chat streams SSE).
// Loaded before app.js, which routes #/chat and #/chat/<agent> here. Text only, never innerHTML.
"use strict";

window.engrainChat = (() => {
  const { h, badge, short, setStatus, errorBox, table, token, api, enc } = window.engrainUI;

  async function agentsView() {
    const agents = (await api("GET", "/api/agents")).filter((a) => a.kind === "llm");
    const rows = agents.map((a) => h("tr", { "data-agent": a.name },
      h("td", {}, h("a", { href: `#/chat/${enc(a.name)}`, text: a.name })),
      h("td", { class: "mono", text: a.model }),
      h("td", { text: (a.tools || []).join(", ") || "—" }),
      h("td", { text: short(a.instructions || "", 100) || "—" })));
    return [
      h("h1", { text: "Chat with an agent" }),
      agents.length
        ? table(["Agent", "Model", "Tools", "Instructions"], rows)
        : h("p", { class: "muted", text: "No LLM agents yet: create one with POST /api/agents or engrain.Client.create_agent()." }),
    ];
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
    const [agents, past] = await Promise.all([
      api("GET", "/api/agents"),
      api("GET", `/api/agents/${enc(agentName)}/sessions/${enc(session)}`),
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
    return [
      h("h1", { text: `Chat: ${agentName}` }),
      h("p", { class: "muted" }, h("span", { class: "mono", text: agent.model }), ` · session ${session} · `,
        h("a", { href: `#/chat/${enc(agentName)}?session=${enc(newSession())}`, text: "new session" })),
      log,
      form,
    ];
  }

  return { agentsView, chatView };
})();
