// engrain web UI: routines agents learned from their runs (GET /api/learned), shown on #/routines.
// Loaded before app.js; review actions are promote / take back and delete. Text only, never innerHTML.
"use strict";

window.engrainLearned = (() => {
  const { h, badge, short, setStatus, details, table, api, enc } = window.engrainUI;

  function action(label, r, method, path, body, confirmText, cls) {
    return h("button", {
      type: "button", class: cls || "", text: label, "aria-label": `${label} learned routine ${r.name}`,
      onclick: async (ev) => {
        if (confirmText && !window.confirm(confirmText)) return;
        ev.target.disabled = true;
        try {
          await api(method, path, body);
          window.dispatchEvent(new HashChangeEvent("hashchange"));  // re-render the page (it clears the status)
          setStatus(`${label}: ${r.name}.`);
        } catch (err) {
          setStatus(err.message, true);
          ev.target.disabled = false;
        }
      },
    });
  }

  async function section() {
    const list = await api("GET", "/api/learned");
    const rows = list.map((r) => h("tr", { "data-learned": r.name },
      h("td", { class: "mono", text: r.name }),
      h("td", { text: r.skill }),
      h("td", {}, badge(r.status, r.status === "confirmed" ? "ok" : r.status === "not_compilable" ? "error" : ""),
        " ", badge(r.trusted ? "trusted" : r.demoted ? "withheld" : "untrusted", r.demoted ? "error" : "")),
      h("td", { text: Object.keys((r.inputs && r.inputs.properties) || {}).join(", ") || "—" }),
      h("td", {}, h("details", {}, h("summary", { text: `${r.tasks.length} task(s)` }),
        h("ul", {}, r.tasks.map((t) => h("li", { text: short(t, 120) })))),
        r.problems.length ? details("not compilable", r.problems) : null),
      h("td", { class: "num", text: `${r.uses} / ${r.stops}` }),
      h("td", {},
        action(r.trusted ? "Take back" : "Promote", r, "POST", `/api/learned/${enc(r.id)}/promote`, { trusted: !r.trusted }),
        // an unreviewed routine confirmed by runs is offered too: a human can withhold it without promoting it first
        !r.trusted && !r.demoted && r.status === "confirmed"
          ? [" ", action("Withhold", r, "POST", `/api/learned/${enc(r.id)}/promote`, { trusted: false })] : null,
        " ",
        action("Delete", r, "DELETE", `/api/learned/${enc(r.id)}`, undefined, `Delete learned routine ${r.name}?`, "danger"))));
    return [
      h("h2", { text: "Learned by agents" }),
      list.length
        ? table(["Routine", "Skill", "State", "Inputs", "Learned from", ["Uses / stops", "num"], "Review"], rows)
        : h("p", { class: "muted", text: "No learned routines yet: run an agent with learn=True." }),
    ];
  }

  return { section };
})();
