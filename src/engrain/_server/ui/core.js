// engrain web UI, shared pieces: DOM building, formatting, the API client and forms.
// All data reaches the page through textContent / attributes, never innerHTML,
// so run output, YAML and memory text cannot inject markup.
"use strict";

window.engrainUI = (() => {
  const TOKEN_KEY = "engrain.token";
  const statusEl = document.getElementById("status");
  const tokenPanel = document.getElementById("token-panel");
  const tokenInput = document.getElementById("token-input");

  // ---------------------------------------------------------------- DOM helpers

  const PROPS = new Set(["disabled", "hidden", "checked", "required", "value", "open", "selected"]);

  /** Create an element. attrs: {class, text, onX: fn, prop/attribute: value}; children: nodes/strings/arrays. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, val] of Object.entries(attrs || {})) {
      if (val === null || val === undefined || val === false) continue;
      if (key === "class") el.className = val;
      else if (key === "text") el.textContent = String(val);
      else if (key.startsWith("on") && typeof val === "function") el.addEventListener(key.slice(2), val);
      else if (PROPS.has(key)) el[key] = val;
      else el.setAttribute(key, val === true ? "" : String(val));
    }
    append(el, children);
    return el;
  }

  function append(el, children) {
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      if (Array.isArray(child)) append(el, child);
      else if (child instanceof Node) el.appendChild(child);
      else el.appendChild(document.createTextNode(String(child)));
    }
  }

  function badge(text, kind) {
    return h("span", { class: `badge ${kind || text}`, text });
  }

  function pretty(value) {
    if (value === undefined) return "";
    if (typeof value === "string") return value;
    try {
      return JSON.stringify(value, null, 2);
    } catch (e) {
      return String(value);
    }
  }

  function short(value, max = 80) {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    if (text === undefined) return "";
    return text.length > max ? text.slice(0, max - 1) + "…" : text;
  }

  function fmtTime(ts) {
    if (typeof ts !== "number") return "—";
    return new Date(ts * 1000).toLocaleString();
  }

  function ago(ts) {
    if (typeof ts !== "number") return "—";
    const s = Math.max(0, Date.now() / 1000 - ts);
    if (s < 60) return `${Math.round(s)} s ago`;
    if (s < 3600) return `${Math.round(s / 60)} min ago`;
    if (s < 86400) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} d ago`;
  }

  function timeCell(ts) {
    return h("time", { datetime: typeof ts === "number" ? new Date(ts * 1000).toISOString() : null, title: fmtTime(ts), text: ago(ts) });
  }

  function fmtMs(ms) {
    if (typeof ms !== "number") return "—";
    if (ms < 1) return `${ms.toFixed(2)} ms`;
    if (ms < 1000) return `${ms.toFixed(1)} ms`;
    return `${(ms / 1000).toFixed(2)} s`;
  }

  function setStatus(message, isError) {
    statusEl.textContent = message || "";
    statusEl.classList.toggle("error", Boolean(isError));
  }

  function errorBox(err) {
    const text = err instanceof ApiError ? `${err.error} (${err.status}): ${err.detail}` : String(err && err.message ? err.message : err);
    return h("div", { class: "error-box", role: "alert", text });
  }

  function details(label, value) {
    return h("details", {}, h("summary", { text: label }), h("pre", { text: pretty(value) }));
  }

  function table(headers, rows, caption) {
    return h("table", {},
      caption ? h("caption", { class: "muted", text: caption }) : null,
      h("thead", {}, h("tr", {}, headers.map((hd) => {
        const [label, cls] = Array.isArray(hd) ? hd : [hd, null];
        return h("th", { scope: "col", class: cls, text: label });
      }))),
      h("tbody", {}, rows));
  }

  function card(label, value, testid) {
    return h("li", { class: "card", "data-testid": testid }, h("span", { class: "label", text: label }), h("span", { class: "value", text: value }));
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, error, detail) {
      super(`${error}: ${detail}`);
      this.status = status;
      this.error = error;
      this.detail = typeof detail === "string" ? detail : pretty(detail);
    }
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const tok = token();
    if (tok) headers.Authorization = `Bearer ${tok}`;
    const init = { method, headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, "NetworkError", `cannot reach the server (${e.message})`);
    }
    let data = null;
    const text = await resp.text();
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (e) {
        data = { error: "BadResponse", detail: text.slice(0, 500) };
      }
    }
    if (!resp.ok) {
      if (resp.status === 401) askToken(tok ? "The token was refused; enter the right one." : "This server requires a token.");
      const err = data && typeof data === "object" ? data : {};
      throw new ApiError(resp.status, err.error || `HTTP ${resp.status}`, err.detail || resp.statusText);
    }
    return data;
  }

  const enc = encodeURIComponent;

  function askToken(message) {
    tokenPanel.hidden = false;
    setStatus(message, true);
    tokenInput.focus();
  }

  // ---------------------------------------------------------------- forms from schemas

  /** Controls for a prompt's fields ({name, type: text|number|boolean|select, label, options, default, required}). */
  function promptFields(fields, idPrefix) {
    const list = (Array.isArray(fields) ? fields : []).map((f) => (typeof f === "string" ? { name: f, type: "text" } : f || {}));
    const controls = [];
    const nodes = list.filter((f) => typeof f.name === "string" && f.name).map((f, i) => {
      const id = `${idPrefix}-${i}`;
      const type = f.type || "text";
      const labelText = f.label || f.name;
      const required = f.required !== false && f.default === undefined;
      let input;
      if (type === "boolean") {
        input = h("input", { id, name: f.name, type: "checkbox", checked: f.default === true });
        controls.push({ name: f.name, read: () => input.checked });
        return h("div", { class: "field check" }, input, h("label", { for: id, text: labelText }));
      }
      if (type === "select") {
        input = h("select", { id, name: f.name, required },
          (f.options || []).map((o) => h("option", { value: String(o), text: String(o), selected: o === f.default })));
        const options = f.options || [];
        controls.push({ name: f.name, read: () => options[input.selectedIndex] });
      } else {
        input = h("input", {
          id, name: f.name, type: type === "number" ? "number" : "text", step: type === "number" ? "any" : null,
          required, value: f.default !== undefined && f.default !== null ? String(f.default) : null,
        });
        controls.push({
          name: f.name,
          read: () => (type === "number" && input.value !== "" ? Number(input.value) : input.value),
          skip: () => input.value === "" && !required,
        });
      }
      return h("div", { class: "field" }, h("label", { for: id, text: labelText }), input);
    });
    const read = () => {
      const out = {};
      for (const c of controls) if (!(c.skip && c.skip())) out[c.name] = c.read();
      return out;
    };
    return { nodes, read };
  }

  /** Controls for a routine's JSON-schema inputs; read() throws on a JSON field that does not parse. */
  function schemaFields(schema, idPrefix) {
    schema = schema && typeof schema === "object" ? schema : {};
    const props = schema.properties && typeof schema.properties === "object" ? schema.properties : {};
    const requiredSet = new Set(Array.isArray(schema.required) ? schema.required : []);
    const controls = [];
    const nodes = Object.entries(props).map(([name, spec], i) => {
      spec = spec && typeof spec === "object" ? spec : {};
      const id = `${idPrefix}-${i}`;
      const type = Array.isArray(spec.type) ? spec.type.find((t) => t !== "null") : spec.type;
      const required = requiredSet.has(name);
      const label = h("label", { for: id }, spec.title || name, required ? " (required)" : "");
      const hint = spec.description ? h("span", { class: "hint", id: `${id}-hint`, text: spec.description }) : null;
      const described = hint ? `${id}-hint` : null;
      let input;
      if (type === "boolean") {
        input = h("input", { id, name, type: "checkbox", checked: spec.default === true, "aria-describedby": described });
        controls.push({ name, read: () => input.checked });
        return h("div", { class: "field check" }, input, label, hint);
      }
      if (Array.isArray(spec.enum)) {
        input = h("select", { id, name, required, "aria-describedby": described },
          required ? null : h("option", { value: "", text: "—" }),
          spec.enum.map((o) => h("option", { value: JSON.stringify(o), text: String(o), selected: o === spec.default })));
        controls.push({ name, read: () => JSON.parse(input.value), skip: () => input.value === "" });
      } else if (type === "integer" || type === "number") {
        input = h("input", {
          id, name, type: "number", step: type === "integer" ? "1" : "any", required, "aria-describedby": described,
          value: typeof spec.default === "number" ? String(spec.default) : null,
        });
        controls.push({ name, read: () => Number(input.value), skip: () => input.value === "" });
      } else if (type === "string" || type === undefined) {
        input = h("input", {
          id, name, type: "text", required, "aria-describedby": described,
          value: typeof spec.default === "string" ? spec.default : null,
        });
        controls.push({ name, read: () => input.value, skip: () => input.value === "" && !required });
      } else {
        input = h("textarea", {
          id, name, required, "aria-describedby": described,
          placeholder: type === "array" ? "JSON array, e.g. [1, 2]" : "JSON value",
          value: spec.default !== undefined ? JSON.stringify(spec.default) : null,
        });
        controls.push({
          name,
          read: () => {
            try {
              return JSON.parse(input.value);
            } catch (e) {
              throw new Error(`input ${name}: not valid JSON (${e.message})`);
            }
          },
          skip: () => input.value.trim() === "",
        });
      }
      return h("div", { class: "field" }, label, input, hint);
    });
    const read = () => {
      const out = {};
      for (const c of controls) if (!(c.skip && c.skip())) out[c.name] = c.read();
      return out;
    };
    return { nodes, read };
  }

  /** A panel asking a needs_input prompt; onAnswered(result) after the answers are accepted. */
  function promptPanel(runId, prompt, onAnswered) {
    const { nodes, read } = promptFields(prompt.fields, `answer-${prompt.call_id}`);
    const out = h("div", { "aria-live": "polite" });
    const submit = h("button", { type: "submit", text: "Submit answers" });
    const form = h("form", {
      "aria-label": "Answer the prompt",
      onsubmit: async (e) => {
        e.preventDefault();
        submit.disabled = true;
        out.replaceChildren();
        try {
          const res = await api("POST", `/api/runs/${enc(runId)}/answers`, { answers: read() });
          setStatus(res.resumed ? `Run resumed: ${res.status}` : "Answers recorded.");
          onAnswered(res);
        } catch (err) {
          out.replaceChildren(errorBox(err));
          submit.disabled = false;
        }
      },
    }, nodes, submit);
    return h("section", { class: "panel prompt", "aria-labelledby": `prompt-${prompt.call_id}` },
      h("h2", { id: `prompt-${prompt.call_id}`, text: "Waiting for input" }),
      h("p", { class: "prompt-text", text: prompt.prompt || "" }),
      form, out);
  }

  return { h, append, badge, pretty, short, fmtTime, ago, timeCell, fmtMs, setStatus, errorBox, details, table, card, ApiError, token, api, enc, askToken, promptFields, schemaFields, promptPanel, TOKEN_KEY };
})();
