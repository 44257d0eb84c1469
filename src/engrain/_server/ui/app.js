// engrain web UI: a single-page app over the JSON API under /api (see docs/api.md).
// Views and the hash router; the shared helpers are in core.js (window.engrainUI).
"use strict";

(() => {
  const {
    h, badge, pretty, short, fmtTime, timeCell, fmtMs, setStatus, errorBox, details, table, card,
    token, api, enc, schemaFields, promptPanel, TOKEN_KEY,
  } = window.engrainUI;
  const view = document.getElementById("view");
  const tokenPanel = document.getElementById("token-panel");
  const tokenForm = document.getElementById("token-form");
  const tokenInput = document.getElementById("token-input");
  const tokenForget = document.getElementById("token-forget");
  const serverInfo = document.getElementById("server-info");
  const TERMINAL = new Set(["run.completed", "run.failed", "run.cancelled"]);
  const EVENT_KINDS = [
    "run.started", "step.started", "step.completed", "step.failed", "check.failed", "input.requested",
    "input.received", "replay.started", "replay.diverged", "replay.completed", "run.completed", "run.failed", "run.cancelled",
    "log.entry",
  ];

  // Functions to call when leaving the current view (close SSE streams, timers).
  let cleanups = [];
  // Bumped on every navigation: a view whose fetch resolves after the user moved on draws nothing.
  let generation = 0;

  // ---------------------------------------------------------------- token

  tokenForm.addEventListener("submit", (e) => {
    e.preventDefault();
    const value = tokenInput.value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    tokenInput.value = "";
    tokenPanel.hidden = true;
    tokenForget.hidden = false;
    setStatus("Token saved for this tab.");
    loadHealth();
    route();
  });

  tokenForget.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    tokenForget.hidden = true;
    setStatus("Token forgotten.");
  });

  async function loadHealth() {
    tokenForget.hidden = !token();
    try {
      const info = await api("GET", "/api/health");
      serverInfo.textContent = `engrain ${info.version} · ${info.backend}${info.auth ? " · token auth" : ""}`;
    } catch (e) {
      serverInfo.textContent = "";
    }
  }
  // ---------------------------------------------------------------- runs

  async function runsView(params) {
    const status = params.get("status") || "";
    const task = params.get("task") || "";
    const internal = params.get("internal") === "1";
    const q = new URLSearchParams({ limit: "200" });
    if (status) q.set("status", status);
    if (task) q.set("task", task);
    if (!internal) q.set("internal", "false");  // agent definitions and cache calls, shown on request
    const runs = await api("GET", `/api/runs?${q}`);
    const statusSel = h("select", { id: "runs-status", name: "status" },
      ["", "ok", "failed", "needs_input", "running", "queued", "cancelled"].map((s) => h("option", { value: s, text: s || "any", selected: s === status })));
    statusSel.value = status;
    const taskIn = h("input", { id: "runs-task", name: "task", type: "search", value: task, "aria-describedby": "runs-task-hint" });
    const internalIn = h("input", {
      id: "runs-internal", name: "internal", type: "checkbox", checked: internal,
      onchange: () => form.requestSubmit(),
    });
    const form = h("form", {
      class: "toolbar", role: "search", "aria-label": "Filter runs",
      onsubmit: (e) => {
        e.preventDefault();
        const p = new URLSearchParams();
        if (statusSel.value) p.set("status", statusSel.value);
        if (taskIn.value.trim()) p.set("task", taskIn.value.trim());
        if (internalIn.checked) p.set("internal", "1");
        const target = `#/runs${p.toString() ? "?" + p : ""}`;
        if (location.hash === target) route();
        else location.hash = target;
      },
    },
    h("div", { class: "field" }, h("label", { for: "runs-status", text: "Status" }), statusSel),
    h("div", { class: "field" }, h("label", { for: "runs-task", text: "Task" }), taskIn,
      h("span", { class: "hint", id: "runs-task-hint", text: "exact task text" })),
    h("div", { class: "field check" }, internalIn,
      h("label", { for: "runs-internal", text: "Show internal runs (agent definitions, cache calls)" })),
    h("button", { type: "submit", text: "Filter" }));
    const rows = runs.map((r) => h("tr", {
      class: [r.status === "failed" ? "failed" : "", r.kind === "internal" ? "internal" : ""].join(" ").trim() || null,
      "data-run-id": r.run_id, "data-kind": r.kind || "run",
    },
      h("td", {}, h("a", { href: `#/runs/${enc(r.run_id)}`, class: "mono", text: r.run_id })),
      // An adapter's log (a LangGraph thread) never finishes: show what it is, not "running".
      h("td", {}, r.kind === "thread" || r.kind === "session" ? badge(r.kind, "log") : badge(r.status),
        r.kind === "internal" ? [" ", badge("internal", "muted")] : null),
      h("td", { text: r.task }),
      h("td", { text: (r.tags || []).join(", ") }),
      h("td", {}, timeCell(r.updated)),
      h("td", { class: "num", text: r.events })));
    return [
      h("h1", { text: "Runs" }),
      form,
      runs.length ? table(["Run", "Status", "Task", "Tags", "Updated", ["Events", "num"]], rows) : h("p", { class: "muted", text: "No runs match." }),
    ];
  }

  function stepRow(s) {
    const source = s.type === "input" ? "human" : s.replayed ? "replayed" : "executed";
    const body = [];
    if (s.args && Object.keys(s.args).length) body.push(details("args", s.args));
    if (s.result !== null && s.result !== undefined) body.push(details("result", s.result));
    if (s.error) body.push(h("div", { class: "error-box", text: `${s.error.type}: ${s.error.message}` }));
    return h("tr", { class: s.state === "failed" ? "failed" : null, "data-step": s.call_id },
      h("td", { class: "num", text: s.call_id }),
      h("td", { class: "mono", text: s.name }),
      h("td", { text: s.type }),
      h("td", {}, badge(s.state)),
      h("td", {}, badge(source, source === "human" ? "answered" : source)),
      h("td", { class: "num duration", text: fmtMs(s.duration_ms) }),
      h("td", { class: "num", text: s.attempts }),
      h("td", {}, body));
  }

  function eventRow(e, t0) {
    const rel = typeof e.ts === "number" && typeof t0 === "number" ? `+${(e.ts - t0).toFixed(3)} s` : "—";
    const hasData = e.data && Object.keys(e.data).length;
    return h("tr", { "data-seq": e.seq, class: e.kind === "step.failed" || e.kind === "run.failed" ? "failed" : null },
      h("td", { class: "num", text: e.seq }),
      h("td", { class: "num" }, h("time", { title: fmtTime(e.ts), "data-ts": typeof e.ts === "number" ? String(e.ts) : null, text: rel })),
      h("td", { class: "mono", text: e.kind }),
      h("td", { class: "mono", text: e.name }),
      // An adapter's log entry (a LangGraph checkpoint, a session item) leads with its summary, not its payload.
      h("td", {}, hasData ? h("details", {}, h("summary", { text: short(e.kind === "log.entry" && e.data.summary ? e.data.summary : e.data, 70) }),
        h("pre", { text: pretty(e.data) })) : null));
  }

  // The run's events as a table: the server sends a bounded view (its first events, and when the run
  // has more, its last ones), so a run of 100,000 events never draws 100,000 rows; the gap between
  // them is a "load more" row that reads the next page (GET /api/runs/{id}/events?after=).
  function eventsTable(runId, head, tail, total, t0) {
    const body = h("tbody", {}, head.map((e) => eventRow(e, t0)));
    let after = head.length ? head[head.length - 1].seq : -1;
    const upTo = tail.length ? tail[0].seq : Infinity;
    const shown = () => body.querySelectorAll("tr[data-seq]").length;
    const note = h("span", { class: "muted" });
    const more = h("button", { type: "button", id: "events-more", text: "Load more" });
    const gap = h("tr", { id: "events-gap" }, h("td", { colspan: "5" }, note, " ", more));
    const count = () => {
      note.textContent = `Showing ${shown()} of ${total} events: ${total - shown()} more. `;
    };
    more.addEventListener("click", async () => {
      more.disabled = true;
      try {
        const page = await api("GET", `/api/runs/${enc(runId)}/events?${new URLSearchParams({ after: String(after), limit: "1000" })}`);
        const fresh = page.filter((e) => e.seq > after && e.seq < upTo);
        for (const e of fresh) gap.before(eventRow(e, t0));
        if (fresh.length) after = fresh[fresh.length - 1].seq;
        if (!fresh.length || fresh.length < page.length || page.length < 1000) gap.remove();  // reached the tail, or the end
        count();
      } catch (e) {
        setStatus(e.message, true);
      }
      more.disabled = false;
    });
    if (tail.length) {
      body.append(gap);
      body.append(...tail.map((e) => eventRow(e, t0)));
      count();
    }
    return h("table", { id: "events-table" },
      h("thead", {}, h("tr", {}, [["Seq", "num"], ["Time", "num"], "Kind", "Name", "Data"].map((hd) => {
        const [label, cls] = Array.isArray(hd) ? hd : [hd, null];
        return h("th", { scope: "col", class: cls, text: label });
      }))),
      body);
  }

  function renderRun(data, container, reload) {
    const run = data.run;
    const head = data.events || [];
    const tail = data.events_tail || [];  // absent from an older server: its events were all of them
    const events = head.concat(tail);
    const total = typeof data.events_total === "number" ? data.events_total : events.length;
    const stepsTotal = typeof data.steps_total === "number" ? data.steps_total : (data.steps || []).length;
    const started = events.find((e) => e.kind === "run.started");
    const t0 = events.length ? events[0].ts : null;
    const tEnd = events.length ? events[events.length - 1].ts : null;
    const nodes = [
      h("p", {}, h("a", { href: "#/runs", text: "← All runs" })),
      h("h1", {}, data.log ? `${data.log.kind === "thread" ? "LangGraph thread" : "Session"} ` : "Run ",
        h("span", { class: "mono", text: data.log ? data.log.id : run.run_id })),
      h("dl", { class: "meta" },
        h("dt", { text: "Status" }), h("dd", {}, data.log ? badge(data.log.kind, "log") : badge(run.status), " ",
          h("span", { id: "live-indicator", class: "live" })),
        h("dt", { text: "Task" }), h("dd", { text: run.task }),
        h("dt", { text: "Tags" }), h("dd", { text: (run.tags || []).join(", ") || "—" }),
        h("dt", { text: "Created" }), h("dd", { text: fmtTime(run.created) }),
        h("dt", { text: "Updated" }), h("dd", {}, timeCell(run.updated)),
        h("dt", { text: "Elapsed" }), h("dd", { text: t0 !== null ? fmtMs((tEnd - t0) * 1000) : "—" }),
        h("dt", { text: "Events" }), h("dd", { id: "events-total", text: total }),
        started && started.data && started.data.inputs && Object.keys(started.data.inputs).length
          ? [h("dt", { text: "Inputs" }), h("dd", {}, h("pre", { text: pretty(started.data.inputs) }))] : null),
    ];
    if (data.error) nodes.push(h("div", { class: "error-box", role: "alert" }, h("strong", { text: "Error: " }), data.error));
    const failure = events.filter((e) => e.kind === "run.failed").pop();
    const trace = failure && failure.data && typeof failure.data.traceback === "string" ? failure.data.traceback : "";
    if (trace) {
      nodes.push(h("section", { "aria-labelledby": "run-traceback" },
        h("h2", { id: "run-traceback", text: "Traceback" }),
        h("pre", { class: "traceback", text: trace })));
    }
    if (run.status === "ok") nodes.push(h("section", { "aria-labelledby": "run-output" }, h("h2", { id: "run-output", text: "Output" }), h("pre", { class: "output", text: pretty(data.output) })));
    if (data.prompt) {
      nodes.push(data.prompt.at_most_once ? happenedPanel(run.run_id, data.prompt, () => reload())
        : promptPanel(run.run_id, data.prompt, () => reload()));
    }
    const eventsTitle = h("h2", { id: "events-title", text: `Events (${total})` });
    if (data.log) {
      nodes.push(window.engrainLogs.logPanel(data.log));
      nodes.push(eventsTitle, eventsTable(run.run_id, head, tail, total, t0));
      container.replaceChildren(...nodes);
      return;
    }
    const steps = data.steps || [];
    nodes.push(runActions(run, stepsTotal, reload));
    nodes.push(waterfall(steps, events));
    nodes.push(h("h2", { text: `Steps (${stepsTotal})` }));
    nodes.push(steps.length
      ? table([["#", "num"], "Step", "Type", "State", "Source", ["Duration", "num"], ["Attempts", "num"], "Details"], steps.map(stepRow),
        stepsTotal > steps.length ? `the first ${steps.length} of ${stepsTotal} steps` : null)
      : h("p", { class: "muted", text: "No steps." }));
    nodes.push(eventsTitle, eventsTable(run.run_id, head, tail, total, t0));
    container.replaceChildren(...nodes);
  }

  // An at-most-once step found started but unfinished asks "did this step happen?": exactly one
  // of {result}, {retry: true} or {error} answers it, so each gets its own button.
  function happenedPanel(runId, prompt, onAnswered) {
    const out = h("div", { "aria-live": "polite" });
    const result = h("textarea", { id: "happened-result", placeholder: 'What it returned, as JSON, e.g. {"id": "ch_123"}' });
    const message = h("input", { id: "happened-error", type: "text", placeholder: "e.g. declined by the provider" });
    const send = async (answers) => {
      out.replaceChildren();
      try {
        const res = await api("POST", `/api/runs/${enc(runId)}/answers`, { answers });
        setStatus(res.resumed ? `Run resumed: ${res.status}` : "Answer recorded: the run continues when it is resumed.");
        onAnswered(res);
      } catch (err) {
        out.replaceChildren(errorBox(err));
      }
    };
    const button = (id, text, answers) => h("button", { type: "button", id, text, onclick: () => {
      let value;
      try {
        value = answers();
      } catch (err) {
        out.replaceChildren(errorBox(err));
        return;
      }
      send(value);
    } });
    return h("section", { class: "panel prompt", id: "happened", "aria-labelledby": "happened-title" },
      h("h2", { id: "happened-title", text: `Did step ${prompt.call_id} (${prompt.step || ""}) happen?` }),
      h("p", { class: "prompt-text", text: prompt.prompt || "" }),
      h("div", { class: "field" }, h("label", { for: "happened-result", text: "It happened, and returned" }), result),
      button("happened-yes", "Record this result", () => {
        try {
          return { result: JSON.parse(result.value) };
        } catch (e) {
          throw new Error(`the result is not valid JSON (${e.message})`);
        }
      }),
      h("div", { class: "toolbar" }, button("happened-retry", "It did not happen: call it again", () => ({ retry: true }))),
      h("div", { class: "field" }, h("label", { for: "happened-error", text: "Fail the step with" }), message),
      button("happened-fail", "Fail the step", () => {
        if (!message.value.trim()) throw new Error("say why the step failed");
        return { error: message.value };
      }),
      out);
  }

  // Cancel and fork: journal operations on this run (POST /api/runs/{id}/cancel, /fork).
  function runActions(run, nSteps, reload) {
    const live = ["running", "needs_input", "queued"].includes(run.status);
    const out = h("div", { class: "toolbar", role: "group", "aria-label": "Run actions" });
    if (live) {
      out.append(h("button", {
        type: "button", id: "cancel-run", class: "danger",
        onclick: async () => {
          if (!confirm(`Cancel run ${run.run_id}? It stops at its next step and is never resumed.`)) return;
          try {
            const r = await api("POST", `/api/runs/${enc(run.run_id)}/cancel`, { reason: "cancelled from the web UI" });
            setStatus(r.cancelled ? "Run cancelled." : "The run had already finished.");
            reload();
          } catch (e) {
            setStatus(e.message, true);
          }
        },
      }, "Cancel run"));
    }
    const at = h("input", { id: "fork-at", class: "narrow", type: "number", min: "0", max: String(nSteps), value: String(Math.max(0, nSteps - 1)) });
    out.append(h("div", { class: "field" }, h("label", { for: "fork-at", text: "Fork at step" }), at),
      h("button", {
        type: "button", id: "fork-run",
        onclick: async () => {
          try {
            const r = await api("POST", `/api/runs/${enc(run.run_id)}/fork`, { at_step: Number(at.value) });
            setStatus(`Forked as ${r.run_id}: resume it with its agent to execute from step ${r.at_step}.`);
            location.hash = `#/runs/${enc(r.run_id)}`;
          } catch (e) {
            setStatus(e.message, true);
          }
        },
      }, "Fork"));
    return out;
  }

  // Positions go through the CSSOM: the server's CSP allows no inline style attributes.
  function place(el, left, width) {
    el.style.left = left;
    if (width !== null) el.style.width = width;
    return el;
  }

  // The run's life at a glance: one bar per step on a time axis (executed, replayed from the
  // cache, retried, failed), sleeps and waits for input drawn to their end, resumes marked.
  function waterfall(steps, events) {
    const timed = steps.filter((s) => typeof s.started === "number");
    if (!events.length) return null;
    const t0 = events[0].ts;
    let t1 = events[events.length - 1].ts;
    const sleeps = [];
    for (const s of timed) {
      if (s.type === "sleep" && s.result && typeof s.result.until === "number") {
        sleeps.push({ from: s.ended || s.started, to: s.result.until, step: s.call_id });
      }
      t1 = Math.max(t1, s.ended || s.started);
    }
    const resumes = events.filter((e) => e.data && typeof e.data.resumed === "number").map((e) => e.data.resumed);
    const span = Math.max(t1 - t0, 1e-3);
    const pct = (t) => `${Math.min(100, Math.max(0, ((t - t0) / span) * 100)).toFixed(3)}%`;
    const width = (a, b) => `${Math.max(0.4, Math.min(100, ((Math.min(b, t1) - a) / span) * 100)).toFixed(3)}%`;
    const kind = (s) => s.state === "failed" ? "failed" : s.attempts > 1 || s.state === "retrying" ? "retried"
      : s.replayed ? "replayed" : s.type === "input" ? "input" : s.type === "sleep" ? "sleep" : "executed";
    const rows = timed.map((s) => {
      const end = s.ended || t1;
      const k = kind(s);
      const bar = place(h("span", {
        class: `wf-bar ${k}`, title: `step ${s.call_id} ${s.name}: ${k}, ${fmtMs((end - s.started) * 1000)}`,
      }), pct(s.started), width(s.started, end));
      const extra = sleeps.filter((z) => z.step === s.call_id).map((z) => place(h("span", {
        class: "wf-bar sleeping", title: `sleeping until ${fmtTime(z.to)}`,
      }), pct(z.from), width(z.from, z.to)));
      return h("li", { class: "wf-row", "data-step": s.call_id, "data-kind": k },
        h("span", { class: "wf-label mono", text: `${s.call_id} ${s.name}` }),
        h("span", { class: "wf-track" }, bar, ...extra));
    });
    const marks = resumes.map((t) => place(h("span", { class: "wf-resume", title: `resumed at ${fmtTime(t)}` }), pct(t), null));
    const legend = ["executed", "replayed", "retried", "failed", "sleep", "input"].map((k) =>
      h("span", { class: "wf-key" }, h("span", { class: `wf-swatch ${k}` }), k));
    return h("section", { "aria-labelledby": "wf-title", class: "waterfall", id: "waterfall" },
      h("h2", { id: "wf-title", text: "Timeline" }),
      h("p", { class: "wf-legend muted" }, ...legend, h("span", { class: "wf-key" }, h("span", { class: "wf-swatch resume" }), "resumed"),
        ` · ${fmtMs(span * 1000)} in all`),
      h("div", { class: "wf-body" }, h("ol", { class: "wf" }, ...rows), h("div", { class: "wf-marks", "aria-hidden": "true" }, ...marks)));
  }

  async function queuesView() {
    const data = await api("GET", "/api/queues");
    const qrows = data.queues.map((q) => h("tr", { "data-queue": q.name },
      h("td", { class: "mono", text: q.name }),
      h("td", { class: "num", text: q.concurrency === null ? "—" : q.concurrency }),
      h("td", { text: q.rate ? `${q.rate[0]} / ${q.rate[1]} s` : "—" }),
      h("td", { class: "num" }, h("a", { href: "#/runs?status=queued", text: String(q.queued) })),
      h("td", { class: "num", text: q.running })));
    const wrows = data.workers.map((w) => h("tr", { "data-worker": w.owner },
      h("td", { class: "mono", text: w.owner }),
      h("td", { class: "num", text: w.runs.length }),
      h("td", {}, ...w.runs.slice(0, 10).map((r) => h("a", { href: `#/runs/${enc(r)}`, class: "mono", text: `${short(r, 14)} ` })))));
    return [
      h("h1", { text: "Queues" }),
      data.queues.length ? table(["Queue", ["Concurrency", "num"], "Rate", ["Queued", "num"], ["Running", "num"]], qrows)
        : h("p", { class: "muted", text: "No queues yet: runs are queued with engrain.enqueue()." }),
      h("h2", { text: "Workers" }),
      data.workers.length ? table(["Lease owner (host:pid)", ["Runs", "num"], "Running now"], wrows)
        : h("p", { class: "muted", text: "No process holds a run right now." }),
    ];
  }

  async function runView(runId) {
    const gen = generation;
    const container = h("div", { id: "run-view" });
    let source = null;
    let lastSeq = -1;
    let drawn = null;  // what the page was last drawn from: the run's status, event count and last seq
    let timer = null;
    let retry = null;

    const stopStream = () => {
      if (source) source.close();
      source = null;
      const ind = container.querySelector("#live-indicator");
      if (ind) ind.textContent = "";
    };

    // `onlyIfChanged`: a stream that dropped reconnects through here; redrawing an unchanged run would
    // throw away the event pages the reader loaded with "Load more".
    const load = async (onlyIfChanged = false) => {
      const data = await api("GET", `/api/runs/${enc(runId)}`);
      if (gen !== generation) return;
      const seen = (data.events_tail && data.events_tail.length) ? data.events_tail : data.events;
      lastSeq = seen.length ? seen[seen.length - 1].seq : -1;
      const state = `${data.run.status}|${data.events_total}|${lastSeq}`;
      if (!(onlyIfChanged && state === drawn)) {
        renderRun(data, container, () => load().catch((e) => setStatus(e.message, true)));
        drawn = state;
      }
      const live = data.run.status === "running" || data.run.status === "needs_input";
      if (live && !source) openStream();
      if (!live) stopStream();
      const ind = container.querySelector("#live-indicator");
      if (ind) ind.textContent = source ? "● live" : "";
    };

    // While live, each event is appended to the table at once, and the run (status, steps) is read
    // again at most twice a second: a debounce would never fire under a steady stream, and reading
    // the run on every event re-drew the whole page per event.
    const scheduleLoad = () => {
      if (timer) return;
      timer = setTimeout(() => {
        timer = null;
        load().catch((e) => setStatus(e.message, true));
      }, 500);
    };

    const appendLive = (msg) => {
      let e;
      try {
        e = JSON.parse(msg.data);
      } catch (err) {
        return;
      }
      const body = container.querySelector("#events-table tbody");
      if (!body || typeof e.seq !== "number" || e.seq <= lastSeq) return;
      const first = body.querySelector("tr[data-seq]");
      const t0 = first ? Number((first.querySelector("time") || {}).dataset?.ts) : NaN;
      body.append(eventRow(e, Number.isFinite(t0) ? t0 : e.ts));
      lastSeq = e.seq;
      const total = container.querySelector("#events-total");
      if (total) total.textContent = String(Number(total.textContent) + 1);
    };

    const openStream = () => {
      const q = new URLSearchParams({ after: String(lastSeq) });
      if (token()) q.set("token", token());
      source = new EventSource(`/api/runs/${enc(runId)}/stream?${q}`);
      const onEvent = (msg) => {
        appendLive(msg);
        scheduleLoad();
        if (TERMINAL.has(msg.type)) stopStream();
      };
      for (const kind of EVENT_KINDS) source.addEventListener(kind, onEvent);
      source.onmessage = onEvent;
      source.onerror = () => {
        // The server ends the stream at the run's end; otherwise reconnect from the last seen seq.
        stopStream();
        if (gen === generation) retry = setTimeout(() => load(true).catch(() => {}), 2000);
      };
    };

    cleanups.push(() => {
      stopStream();
      clearTimeout(timer);
      timer = null;
      clearTimeout(retry);
    });
    await load();
    return [container];
  }

  // ---------------------------------------------------------------- routines

  async function routinesView() {
    const list = await api("GET", "/api/routines");
    const rows = list.map((r) => h("tr", { "data-routine": r.name },
      h("td", {}, h("a", { href: `#/routines/${enc(r.name)}`, text: r.name })),
      h("td", { text: r.description }),
      h("td", { text: Object.keys((r.inputs && r.inputs.properties) || {}).join(", ") || "—" }),
      h("td", { class: "num", text: r.steps }),
      h("td", {}, r.error ? h("span", { class: "badge error", text: "error", title: r.error }) : badge("ok"))));
    return [
      h("h1", { text: "Routines" }),
      h("p", {}, h("a", { href: "#/compile", text: "Compile a trace into a routine →" })),
      list.length
        ? table(["Routine", "Description", "Inputs", ["Steps", "num"], "State"], rows)
        : h("p", { class: "muted", text: "No routines in the server's routines directory." }),
      ...(await window.engrainLearned.section()),
    ];
  }

  function issuesTable(issues) {
    if (!issues.length) return h("div", { class: "ok-box", role: "status", text: "Valid: no issues." });
    return table(["Severity", "File", "Step", "Field", "Message"], issues.map((i) => h("tr", { class: i.severity === "error" ? "failed" : null },
      h("td", {}, badge(i.severity || "error")),
      h("td", { class: "mono", text: i.file || "" }),
      h("td", { class: "mono", text: i.step || "—" }),
      h("td", { class: "mono", text: i.field || "—" }),
      h("td", { text: i.message }))));
  }

  /** Show a RunResult (from a routine run or an answer) with a prompt form when it needs input. */
  function runResult(res, box) {
    const nodes = [
      h("dl", { class: "meta" },
        h("dt", { text: "Status" }), h("dd", {}, badge(res.status)),
        h("dt", { text: "Run" }), h("dd", {}, res.run_id ? h("a", { href: `#/runs/${enc(res.run_id)}`, class: "mono", text: res.run_id }) : "—"),
        h("dt", { text: "Steps" }), h("dd", { text: `${res.executed ?? 0} executed, ${res.replayed ?? 0} replayed` })),
    ];
    if (res.error) nodes.push(h("div", { class: "error-box", role: "alert", text: res.error }));
    if (res.status === "ok") nodes.push(h("h3", { text: "Output" }), h("pre", { class: "output", text: pretty(res.output) }));
    if (res.status === "needs_input" && res.prompt) {
      nodes.push(promptPanel(res.run_id, res.prompt, (next) => runResult(next, box)));
    }
    box.replaceChildren(h("h2", { id: "result-title", text: "Result" }), ...nodes);
  }

  /** The input schema with the package's input.json values as defaults, so the run form starts filled in. */
  function withExample(schema, example) {
    if (!schema || typeof schema !== "object" || !example || typeof example !== "object") return schema;
    const props = schema.properties && typeof schema.properties === "object" ? schema.properties : null;
    if (!props) return schema;
    const filled = {};
    for (const [name, spec] of Object.entries(props)) {
      filled[name] = Object.prototype.hasOwnProperty.call(example, name) ? { ...(spec || {}), default: example[name] } : spec;
    }
    return { ...schema, properties: filled };
  }

  function udfReport(udfs) {
    if (!udfs || !udfs.length) return h("p", { class: "muted", text: "No UDFs." });
    return table(["UDF", "Written as", "Why"], udfs.map((u) => h("tr", { "data-udf": u.name },
      h("td", { class: "mono", text: u.name }),
      h("td", {}, badge(u.generalized ? "real function" : "replay stub", u.generalized ? "ok" : "needs_input")),
      h("td", { text: u.reason || "recorded with its source: runs on any input" }))));
  }

  async function compileView() {
    const traceBox = h("textarea", { id: "trace-json", rows: 12, class: "mono", placeholder: '{"format": "engrain.trace/1", "events": [...]}' });
    const file = h("input", {
      id: "trace-file", type: "file", accept: ".json,application/json",
      onchange: async () => {
        const f = file.files && file.files[0];
        if (f) traceBox.value = await f.text();
      },
    });
    const out = h("section", { id: "compile-result", "aria-live": "polite" });
    const nameInput = h("input", { id: "routine-name", type: "text" });
    let lastTrace = null;
    const readTrace = () => {
      let trace;
      try {
        trace = JSON.parse(traceBox.value);
      } catch (e) {
        throw new Error(`The trace is not JSON: ${e.message}`);
      }
      if (!trace || typeof trace !== "object" || Array.isArray(trace)) throw new Error("The trace must be a JSON object.");
      return trace;
    };
    const compileBtn = h("button", { type: "submit", text: "Compile" });
    const saveBtn = h("button", {
      type: "button", text: "Save as routine", disabled: true,
      onclick: async () => {
        saveBtn.disabled = true;
        try {
          const res = await api("POST", "/api/routines/compile", { name: nameInput.value, trace: lastTrace });
          setStatus(`Saved routine ${res.name}.`);
          out.append(h("p", { class: "ok-box", role: "status" }, "Saved: ",
            h("a", { href: `#/routines/${enc(res.name)}`, text: `open routine ${res.name}` })));
        } catch (err) {
          out.append(errorBox(err));
        } finally {
          saveBtn.disabled = false;
        }
      },
    });
    const form = h("form", {
      "aria-label": "Compile a trace",
      onsubmit: async (e) => {
        e.preventDefault();
        compileBtn.disabled = true;
        saveBtn.disabled = true;
        try {
          const trace = readTrace();
          const res = await api("POST", "/api/routines/compile/preview", { trace });
          lastTrace = trace;
          out.replaceChildren(
            h("h2", { text: "Validation" }), issuesTable(res.issues || []),
            h("h2", { text: "UDFs" }), udfReport(res.udfs),
            h("div", { class: "grid2" },
              h("div", {}, h("h2", { text: "routine.yaml" }), h("pre", { class: "yaml", "aria-label": "Generated routine.yaml", text: res.yaml })),
              h("div", {}, h("h2", { text: "udfs.py" }),
                h("pre", { class: "yaml", "aria-label": "Generated udfs.py", text: res.udfs_py || "(no UDFs: no udfs.py)" }))));
          saveBtn.disabled = false;
          setStatus("Compiled (not saved yet).");
        } catch (err) {
          out.replaceChildren(errorBox(err));
          setStatus("", false);
        } finally {
          compileBtn.disabled = false;
        }
      },
    },
    h("div", { class: "field" }, h("label", { for: "trace-file", text: "Upload a trace file" }), file),
    h("div", { class: "field" }, h("label", { for: "trace-json", text: "Trace JSON" }),
      h("span", { class: "hint", text: "The output of engrain export RUN_ID, or an em-core trace." }), traceBox),
    compileBtn);
    return [
      h("p", {}, h("a", { href: "#/routines", text: "← All routines" })),
      h("h1", { text: "Compile a trace" }),
      h("section", { class: "panel" }, form),
      h("section", { class: "panel", "aria-label": "Save" },
        h("div", { class: "field" }, h("label", { for: "routine-name", text: "Routine name" }), nameInput), saveBtn),
      out,
    ];
  }

  async function routineView(name) {
    const r = await api("GET", `/api/routines/${enc(name)}`);
    const routine = r.routine && typeof r.routine === "object" ? r.routine : {};
    const issuesBox = h("div", { id: "issues", "aria-live": "polite" }, r.issues && r.issues.length ? issuesTable(r.issues) : null);
    const validateBtn = h("button", {
      type: "button", text: "Validate",
      onclick: async () => {
        validateBtn.disabled = true;
        try {
          const res = await api("POST", `/api/routines/${enc(name)}/validate`);
          issuesBox.replaceChildren(issuesTable(res.issues || []));
          setStatus(res.ok ? `${name} is valid.` : `${name} has ${res.issues.length} issue(s).`, !res.ok);
        } catch (e) {
          issuesBox.replaceChildren(errorBox(e));
        } finally {
          validateBtn.disabled = false;
        }
      },
    });
    // The effective schema (an em-core package's converted input_schema), pre-filled from input.json.
    const { nodes, read } = schemaFields(withExample(r.inputs || routine.inputs, r.input), "input");
    const resultBox = h("section", { id: "run-result", "aria-live": "polite", class: "panel", hidden: true });
    const runBtn = h("button", { type: "submit", text: "Run routine" });
    const runForm = h("form", {
      "aria-label": "Run this routine",
      onsubmit: async (e) => {
        e.preventDefault();
        let inputs;
        try {
          inputs = read();
        } catch (err) {
          resultBox.hidden = false;
          resultBox.replaceChildren(errorBox(err));
          return;
        }
        runBtn.disabled = true;
        setStatus(`Running ${name}…`);
        try {
          const res = await api("POST", `/api/routines/${enc(name)}/run`, { inputs });
          resultBox.hidden = false;
          runResult(res, resultBox);
          setStatus(`${name}: ${res.status}`, res.status === "failed");
        } catch (err) {
          resultBox.hidden = false;
          resultBox.replaceChildren(errorBox(err));
          setStatus("", false);
        } finally {
          runBtn.disabled = false;
        }
      },
    }, nodes.length ? nodes : h("p", { class: "muted", text: "This routine takes no inputs." }), runBtn);
    const steps = Array.isArray(routine.steps) ? routine.steps : [];
    return [
      h("p", {}, h("a", { href: "#/routines", text: "← All routines" })),
      h("h1", {}, "Routine ", h("span", { class: "mono", text: r.name })),
      routine.description ? h("p", { text: String(routine.description) }) : null,
      h("div", { class: "grid2" },
        h("div", {},
          h("section", { class: "panel", "aria-labelledby": "validate-title" },
            h("h2", { id: "validate-title", text: "Validation" }), validateBtn, issuesBox),
          h("section", { class: "panel", "aria-labelledby": "run-title" },
            h("h2", { id: "run-title", text: "Run" }), runForm),
          resultBox),
        h("div", {},
          h("h2", { text: `routine.yaml (${steps.length} steps)` }),
          h("pre", { class: "yaml", "aria-label": "routine.yaml", text: r.yaml }))),
    ];
  }

  // ---------------------------------------------------------------- cache

  async function cacheView() {
    const [stats, entries, runs, series] = await Promise.all([
      api("GET", "/api/cache/stats"), api("GET", "/api/cache/entries?limit=200"),
      api("GET", "/api/cache/savings?limit=20"), api("GET", "/api/cache/savings/series?buckets=24"),
    ]);
    const rows = entries.map((e) => {
      const names = (e.steps || []).map((s) => (s && (s.name || s.tool)) || "?");
      return h("tr", { "data-entry": e.id },
        h("td", { text: e.task }),
        h("td", { text: (e.tags || []).join(", ") || "—" }),
        h("td", {}, h("details", {}, h("summary", { text: `${names.length} steps` }), h("ol", {}, names.map((n) => h("li", { class: "mono", text: n }))))),
        h("td", { class: "num", text: e.successes }),
        h("td", { class: "num", text: e.divergences }),
        h("td", {}, timeCell(e.last_used)),
        h("td", {}, e.run_id ? h("a", { href: `#/runs/${enc(e.run_id)}`, class: "mono", text: short(e.run_id, 24) }) : "—"),
        h("td", {}, h("button", {
          type: "button", class: "danger", text: "Evict", "aria-label": `Evict cache entry for ${e.task}`,
          onclick: async (ev) => {
            if (!window.confirm(`Evict the cached trajectory for "${e.task}"?`)) return;
            ev.target.disabled = true;
            try {
              await api("DELETE", `/api/cache/entries/${enc(e.id)}`);
              setStatus(`Evicted entry for "${e.task}".`);
              route();
            } catch (err) {
              setStatus(err.message, true);
              ev.target.disabled = false;
            }
          },
        })));
    });
    const pct = `${((stats.hit_rate || 0) * 100).toFixed(1)}%`;
    return [
      h("h1", { text: "Behavior cache" }),
      h("ul", { class: "cards", "aria-label": "Cache statistics" },
        card("Hit rate", pct, "hit-rate"),
        card("Agent calls saved", stats.agent_calls_saved ?? 0, "calls-saved"),
        card("Hits", stats.hits ?? 0, "hits"),
        card("Misses", stats.misses ?? 0, "misses"),
        card("Diverged", stats.diverged ?? 0, "diverged"),
        card("Entries", stats.entries ?? entries.length, "entries")),
      savingsSection(stats.savings || {}, runs, series),
      h("h2", { text: "Entries" }),
      entries.length
        ? table(["Task", "Tags", "Steps", ["Successes", "num"], ["Divergences", "num"], "Last used", "Recorded run", "Actions"], rows)
        : h("p", { class: "muted", text: "The cache is empty." }),
    ];
  }

  // What the agents' cache saved: totals, calls made against avoided over time, and per run.
  function savingsSection(total, runs, series) {
    const avoided = (total.cache_calls || 0) + (total.resumed_calls || 0);
    const rows = runs.map((r) => h("tr", { "data-savings": r.run_id },
      h("td", {}, h("a", { href: `#/runs/${enc(r.run_id)}`, class: "mono", text: short(r.run_id, 28) })),
      h("td", { text: r.agent }),
      h("td", {}, timeCell(r.ts)),
      h("td", { class: "num", text: r.calls_made }),
      h("td", { class: "num", text: r.cache_calls }),
      h("td", { class: "num", text: r.resumed_calls }),
      h("td", { class: "num", text: r.input_tokens }),
      h("td", { class: "num", text: r.output_tokens }),
      h("td", { class: "num", text: fmtMs((r.model_seconds || 0) * 1000) })));
    return h("section", { "aria-label": "LLM savings" },
      h("h2", { text: "LLM calls saved" }),
      h("ul", { class: "cards", "aria-label": "LLM savings" },
        card("LLM calls made", total.calls_made || 0, "llm-made"),
        card("LLM calls avoided", avoided, "llm-avoided"),
        card("Not paid twice (resumed)", total.resumed_calls || 0, "llm-resumed"),
        card("Tokens avoided (in / out)", `${total.input_tokens || 0} / ${total.output_tokens || 0}`, "tokens-avoided"),
        card("Model time avoided", fmtMs((total.model_seconds || 0) * 1000), "time-avoided")),
      h("figure", { class: "savings" },
        window.engrainSavings.chart(series),
        h("figcaption", { class: "muted" },
          h("span", { class: "key made" }), " calls made ", h("span", { class: "key avoided" }), " calls avoided (cache and resumed runs)")),
      runs.length
        ? table(["Run", "Agent", "When", ["Made", "num"], ["From cache", "num"], ["Resumed", "num"],
          ["Input tokens avoided", "num"], ["Output tokens avoided", "num"], ["Model time avoided", "num"]], rows)
        : h("p", { class: "muted", text: "No agent runs with the cache yet." }));
  }

  // ---------------------------------------------------------------- memory

  function hitItem(hit) {
    return h("li", { "data-hit": hit.id },
      h("div", { class: "head" },
        h("span", { class: "score", text: `score ${Number(hit.score).toFixed(3)}` }),
        badge(hit.tier),
        h("span", { text: `skill: ${hit.skill || "—"}` }),
        h("span", { class: "mono", text: hit.id })),
      h("div", { class: "content", text: hit.content }),
      hit.provenance && Object.keys(hit.provenance).length ? details("provenance", hit.provenance) : null,
      hit.metadata && Object.keys(hit.metadata).length ? details("metadata", hit.metadata) : null);
  }

  function articleItem(a) {
    return h("li", { "data-article": a.id },
      h("div", { class: "head" },
        h("strong", { text: a.title || a.id }),
        h("span", { text: `skill: ${a.skill || "—"}` }),
        h("span", { text: `v${a.version}` }),
        h("span", { text: a.synthesizer || "" }),
        h("span", {}, "updated ", timeCell(a.updated))),
      h("div", { class: "content", text: a.content }),
      h("details", { class: "provenance" },
        h("summary", { text: `provenance: ${(a.sources || []).length} source record(s)` }),
        h("ul", {}, (a.sources || []).map((s) => h("li", {},
          h("span", { class: "mono", text: s.id }), " ",
          s.expired ? h("span", { class: "muted", text: "(expired)" }) : [h("span", { class: "muted" }, "· ", fmtTime(s.created), " · "), s.content])))));
  }

  /** The Consolidate button: one pass over the buffer, then its summary, then the page again. */
  function consolidatePanel(stats) {
    const out = h("div", { id: "consolidate-result", "aria-live": "polite" });
    const button = h("button", {
      type: "button", id: "consolidate", disabled: !stats.buffer,
      onclick: async () => {
        button.disabled = true;
        out.replaceChildren(h("p", { class: "muted", text: "Consolidating…" }));
        try {
          const s = await api("POST", "/api/memory/consolidate", { num_records: "all" });
          setStatus(`Consolidated: ${s.formed || 0} formed, ${s.updated || 0} updated, ${s.dropped || 0} dropped (${s.synthesizer || ""}).`,
            Boolean(s.errors && s.errors.length));
          route();
        } catch (e) {
          out.replaceChildren(errorBox(e));
          button.disabled = false;
        }
      },
    }, "Consolidate");
    return h("section", { class: "toolbar", "aria-label": "Consolidate" },
      button,
      h("span", { class: "hint", text: stats.buffer ? `${stats.buffer} record(s) in the buffer become articles (one per subject).` : "The buffer is empty." }),
      out);
  }

  async function memoryView(params) {
    const [stats, articles] = await Promise.all([api("GET", "/api/memory/stats"), api("GET", "/api/memory/articles")]);
    const query = params.get("q") || "";
    const skill = params.get("skill") || "";
    const qIn = h("input", { id: "mem-query", name: "q", type: "search", value: query, required: true });
    const skillIn = h("input", { id: "mem-skill", name: "skill", type: "text", value: skill });
    const kIn = h("input", { id: "mem-k", name: "top_k", type: "number", min: "1", max: "100", value: params.get("k") || "5" });
    const results = h("div", { id: "recall-results", "aria-live": "polite" });
    const search = async () => {
      const body = { query: qIn.value.trim(), top_k: Number(kIn.value) || 5 };
      if (skillIn.value.trim()) body.skill = skillIn.value.trim();
      results.replaceChildren(h("p", { class: "muted", text: "Searching…" }));
      try {
        const hits = await api("POST", "/api/memory/recall", body);
        results.replaceChildren(
          h("h2", { text: `Results for “${body.query}” (${hits.length})` }),
          hits.length ? h("ul", { class: "results" }, hits.map(hitItem)) : h("p", { class: "muted", text: "Nothing recalled." }));
      } catch (e) {
        results.replaceChildren(errorBox(e));
      }
    };
    const form = h("form", {
      class: "toolbar", role: "search", "aria-label": "Recall from memory",
      onsubmit: (e) => {
        e.preventDefault();
        if (qIn.value.trim()) search();
      },
    },
    h("div", { class: "field" }, h("label", { for: "mem-query", text: "Search memory" }), qIn),
    h("div", { class: "field" }, h("label", { for: "mem-skill", text: "Skill (optional)" }), skillIn),
    h("div", { class: "field" }, h("label", { for: "mem-k", text: "Top k" }), kIn),
    h("button", { type: "submit", text: "Recall" }));
    if (query) search();
    return [
      h("h1", { text: "Memory" }),
      h("ul", { class: "cards", "aria-label": "Memory tiers" },
        card("Records", stats.records ?? 0, "records"),
        card("Buffer", stats.buffer ?? 0, "buffer"),
        card("Articles", stats.articles ?? 0, "articles"),
        card("Consolidations", stats.consolidations ?? 0, "consolidations")),
      h("p", { class: "muted", text: `embedder: ${stats.embedder || "—"} · vector search: ${stats.vector_search || "—"} · backend: ${stats.backend || "—"}` }),
      consolidatePanel(stats),
      form,
      results,
      h("h2", { text: `Articles (${articles.length})` }),
      articles.length ? h("ul", { class: "results", id: "articles" }, articles.map(articleItem)) : h("p", { class: "muted", text: "No articles yet: consolidate the buffer to form some." }),
    ];
  }

  // ---------------------------------------------------------------- router

  async function route() {
    for (const fn of cleanups) fn();
    cleanups = [];
    const gen = ++generation;
    const hash = location.hash.replace(/^#\/?/, "");
    const [pathPart, queryPart] = hash.split("?");
    const parts = pathPart.split("/").filter(Boolean).map((p) => {
      try {
        return decodeURIComponent(p);
      } catch (e) {
        return p;
      }
    });
    const params = new URLSearchParams(queryPart || "");
    const section = parts[0] || "runs";
    for (const a of document.querySelectorAll("[data-nav]")) {
      if (a.dataset.nav === section) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    let render;
    if (section === "runs" && parts[1]) render = () => runView(parts.slice(1).join("/"));
    else if (section === "runs") render = () => runsView(params);
    else if (section === "routines" && parts[1]) render = () => routineView(parts[1]);
    else if (section === "routines") render = () => routinesView();
    else if (section === "compile") render = () => compileView();
    else if (section === "cache") render = () => cacheView();
    else if (section === "queues") render = () => queuesView();
    else if (section === "memory") render = () => memoryView(params);
    else if (section === "chat" && parts[1]) render = () => window.engrainChat.chatView(parts[1], params);
    else if (section === "chat") render = () => window.engrainChat.agentsView();
    else render = async () => [h("h1", { text: "Not found" }), h("p", {}, "No page here. ", h("a", { href: "#/runs", text: "Go to runs" }))];
    document.title = `engrain · ${section}`;
    view.setAttribute("aria-busy", "true");
    try {
      const nodes = await render();
      if (gen !== generation) return;
      view.replaceChildren(...nodes.filter(Boolean));
    } catch (e) {
      if (gen !== generation) return;
      view.replaceChildren(h("h1", { text: "Could not load this page" }), errorBox(e));
    } finally {
      if (gen === generation) view.removeAttribute("aria-busy");
    }
  }

  window.addEventListener("hashchange", () => {
    setStatus("");
    route();
  });
  loadHealth();
  route();
})();
