// engrain web UI: a framework adapter's log shown as what it is (GET /api/runs/{id} -> data.log).
// A LangGraph thread is a run that never finishes: its page shows its checkpoints, the last first,
// instead of a run forever "running". Text only, never innerHTML.
"use strict";

window.engrainLogs = (() => {
  const { h, badge, fmtTime, timeCell, table } = window.engrainUI;

  function checkpointRow(c) {
    return h("tr", { "data-checkpoint": c.id || "" },
      h("td", { class: "num", text: c.step ?? "—" }),
      h("td", { text: c.source || "—" }),
      h("td", { class: "mono", text: c.id || "—" }),
      h("td", { text: c.ns || "—" }),
      // The server sends a list of names, but the log's data is whatever its writer stored: never join a non-list.
      h("td", { text: (Array.isArray(c.channels) ? c.channels.map(String).join(", ") : "") || "—" }),
      h("td", {}, timeCell(c.ts)));
  }

  function logPanel(log) {
    const last = log.last;
    const summary = log.kind === "thread"
      ? (last && last.id
        ? h("p", { id: "last-checkpoint" }, "Last checkpoint: step ", h("strong", { text: String(last.step ?? "—") }),
          ` (${last.source || "—"}) at `, fmtTime(last.ts), " · ", h("span", { class: "mono", text: last.id }))
        : h("p", { class: "muted", text: "No checkpoint yet." }))
      : h("p", { id: "last-checkpoint" }, `${log.entries} entr${log.entries === 1 ? "y" : "ies"}`,
        last ? [", the last at ", fmtTime(last.ts)] : null);
    return h("section", { class: "panel", "aria-labelledby": "log-title" },
      h("h2", { id: "log-title" }, log.kind === "thread" ? "Thread " : "Session ", badge(log.kind, "log")),
      h("p", { class: "muted", text: log.kind === "thread"
        ? `A LangGraph thread is kept as a log of checkpoints: it has no end, and resumes from its last checkpoint (${log.checkpoints} so far).`
        : "An adapter's session is kept as a log of entries: it has no end." }),
      summary,
      log.history && log.history.length
        ? table([["Step", "num"], "Source", "Checkpoint", "Namespace", "Channels written", "Saved"], log.history.map(checkpointRow),
          log.checkpoints > log.history.length ? `the last ${log.history.length} of ${log.checkpoints}` : null)
        : null);
  }

  return { logPanel };
})();
