// engrain web UI: the cache page's chart of LLM calls made against calls avoided over time.
// An inline SVG built with createElementNS (no library, nothing through innerHTML).
"use strict";

window.engrainSavings = (() => {
  const NS = "http://www.w3.org/2000/svg";

  function s(tag, attrs, ...children) {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") el.textContent = String(v);
      else el.setAttribute(k, String(v));
    }
    for (const c of children) if (c) el.appendChild(c);
    return el;
  }

  function label(t, span) {
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return span > 2 * 86400 ? `${d.getMonth() + 1}/${d.getDate()}` : `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  /** Stacked bars per time bucket: calls made (bottom) and avoided (top); series from /api/cache/savings/series. */
  function chart(series) {
    const W = 640, H = 180, L = 40, B = 24, T = 8;
    const pts = series.points || [];
    const max = Math.max(1, ...pts.map((p) => p.made + p.avoided));
    const bw = pts.length ? (W - L - 8) / pts.length : 0;
    const y = (v) => T + (H - T - B) * (1 - v / max);
    const svg = s("svg", {
      viewBox: `0 0 ${W} ${H}`, class: "savings-chart", role: "img", "data-testid": "savings-chart",
      "aria-label": `LLM calls made and avoided over time: ${pts.reduce((a, p) => a + p.made, 0)} made, `
        + `${pts.reduce((a, p) => a + p.avoided, 0)} avoided`,
    });
    svg.appendChild(s("line", { x1: L, y1: y(0), x2: W - 8, y2: y(0), class: "axis" }));
    svg.appendChild(s("text", { x: L - 6, y: y(max) + 4, "text-anchor": "end", class: "tick", text: max }));
    svg.appendChild(s("text", { x: L - 6, y: y(0), "text-anchor": "end", class: "tick", text: 0 }));
    const span = (series.bucket_seconds || 0) * pts.length;
    pts.forEach((p, i) => {
      const x = L + i * bw + 1;
      const g = s("g", { "data-bucket": i, "data-made": p.made, "data-avoided": p.avoided },
        s("title", { text: `${new Date(p.t * 1000).toLocaleString()}: ${p.made} made, ${p.avoided} avoided` }));
      if (p.made) g.appendChild(s("rect", { x, y: y(p.made), width: Math.max(1, bw - 2), height: y(0) - y(p.made), class: "made" }));
      if (p.avoided) {
        g.appendChild(s("rect", {
          x, y: y(p.made + p.avoided), width: Math.max(1, bw - 2), height: y(p.made) - y(p.made + p.avoided), class: "avoided",
        }));
      }
      svg.appendChild(g);
      if (i % Math.max(1, Math.ceil(pts.length / 6)) === 0) {
        svg.appendChild(s("text", { x: x + bw / 2, y: H - 6, "text-anchor": "middle", class: "tick", text: label(p.t, span) }));
      }
    });
    return svg;
  }

  return { chart };
})();
