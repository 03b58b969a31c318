// knowtrace-train report: builds the run view and the question view from the embedded JSON.
// Every piece of record text goes into the page through textContent or setAttribute on inert
// attributes: model output can never become markup or script.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f6fdb", "#d9622b", "#2e9d5b", "#8a4fd1", "#b8860b", "#c2185b"];

  // -- tiny DOM helpers ------------------------------------------------------------------------
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "onclick") el.addEventListener("click", v);
      else if (k === "oninput") el.addEventListener("input", v);
      else el.setAttribute(k, String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  function s(tag, attrs, text) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
    if (text !== undefined && text !== null) el.textContent = String(text);
    return el;
  }
  const fmt = (v, d = 3) => (v === null || v === undefined ? "-" : typeof v === "number" ? v.toFixed(d) : String(v));
  const cut = (t, n) => (t.length > n ? t.slice(0, n - 1) + "…" : t);
  const notes = (list) => (list && list.length ? h("ul", { class: "notes" }, list.map((n) => h("li", {}, n))) : null);

  // -- charts (Figure 2: EM and FA ratio per iteration, one line per run) ------------------------
  function chart(title, ylabel, lines, withIntervals) {
    const W = 420, H = 260, L = 48, R = 12, T = 26, B = 40;
    const xmax = Math.max(1, ...lines.flatMap((l) => l.x));
    const X = (x) => L + (x / xmax) * (W - L - R), Y = (y) => T + (1 - y) * (H - T - B);
    const svg = s("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart-svg" });
    svg.appendChild(s("text", { x: W / 2, y: 16, "text-anchor": "middle", "font-weight": 600, "font-size": 12 }, title));
    for (let i = 0; i <= 5; i++) {
      const y = i / 5;
      svg.appendChild(s("line", { x1: L, x2: W - R, y1: Y(y), y2: Y(y), stroke: "#e3e6ec" }));
      svg.appendChild(s("text", { x: L - 4, y: Y(y) + 4, "text-anchor": "end", "font-size": 10 }, y.toFixed(1)));
    }
    for (let x = 0; x <= xmax; x++)
      svg.appendChild(s("text", { x: X(x), y: H - B + 14, "text-anchor": "middle", "font-size": 10 }, x));
    svg.appendChild(s("text", { x: W / 2, y: H - 8, "text-anchor": "middle", "font-size": 11 }, "iteration (0 = M0)"));
    svg.appendChild(s("text", { x: 12, y: H / 2, "font-size": 11, transform: `rotate(-90 12 ${H / 2})`, "text-anchor": "middle" }, ylabel));
    lines.forEach((l, k) => {
      const c = COLORS[k % COLORS.length];
      if (!l.x.length) return;
      svg.appendChild(s("polyline", { points: l.x.map((x, i) => `${X(x)},${Y(l.y[i])}`).join(" "), fill: "none", stroke: c, "stroke-width": 2, "stroke-dasharray": l.dash ? "5 3" : null }));
      l.x.forEach((x, i) => {
        const iv = withIntervals && l.iv ? l.iv[i] : null;
        if (iv) svg.appendChild(s("line", { x1: X(x), x2: X(x), y1: Y(iv[0]), y2: Y(iv[1]), stroke: c, "stroke-width": 1.2, opacity: 0.7 }));
        const dot = s("circle", { cx: X(x), cy: Y(l.y[i]), r: 3.5, fill: c });
        dot.appendChild(s("title", {}, `${l.label}: ${fmt(l.y[i])}` + (iv ? ` [${fmt(iv[0], 2)}, ${fmt(iv[1], 2)}]` : "")));
        svg.appendChild(dot);
      });
      svg.appendChild(s("text", { x: L + 6, y: T + 12 + 13 * k, fill: c, "font-size": 10 }, cut(l.label, 60)));
    });
    return h("div", { class: "chart" }, svg);
  }

  // -- the run view --------------------------------------------------------------------------------
  function runTable(run) {
    if (!run.rows.length) return h("p", { class: "empty" }, run.kind === "file" ? "A trajectory file: no per-iteration table." : "No iteration has finished yet: no table.");
    const roles = [...new Set(run.rows.flatMap((r) => Object.keys(r.fa_by_role || {})))];
    const recRoles = [...new Set(run.rows.flatMap((r) => Object.keys(r.records || {})))];
    const parts = [...new Set(run.rows.flatMap((r) => Object.keys(r.fa_decomposed || {})))];
    const shape = [...new Set(run.rows.flatMap((r) => Object.keys(r.exploration || {})))];
    const head = ["model", "dev EM [95% CI]", "dev F1 [95% CI]", "EM vs M0", "rollouts correct", "FA", ...roles.map((r) => "FA " + r), ...parts.map((p) => "FA " + p.replace(/_/g, " ")), ...shape.map((k) => k.replace(/_/g, " ")), ...recRoles.map((r) => "records " + r), "seconds"];
    const body = run.rows.map((r) => h("tr", {},
      h("td", {}, r.label, r.status && r.status !== "trained" ? ` (${r.status})` : ""),
      h("td", { class: "num", title: r.interval_note || "" }, r.em_text + (r.interval_note ? " *" : "")),
      h("td", { class: "num" }, r.f1_text),
      h("td", { class: "num" }, r.vs ? `${r.vs.diff >= 0 ? "+" : ""}${fmt(r.vs.diff)} ${r.vs.p || ""} vs ${r.vs.against}` : "-"),
      h("td", { class: "num" }, r.rollout || "-"),
      h("td", { class: "num" }, fmt(r.fa_ratio)),
      roles.map((k) => h("td", { class: "num" }, fmt((r.fa_by_role || {})[k]))),
      parts.map((k) => h("td", { class: "num" }, fmt((r.fa_decomposed || {})[k]))),
      shape.map((k) => h("td", { class: "num" }, fmt((r.exploration || {})[k]))),
      recRoles.map((k) => h("td", { class: "num" }, fmt((r.records || {})[k], 0))),
      h("td", { class: "num", title: Object.entries(r.seconds).map(([k, v]) => `${k} ${v}s`).join(", ") }, fmt(r.seconds_total, 0))));
    const starred = run.rows.some((r) => r.interval_note);
    return h("div", { style: "overflow-x:auto" }, h("table", { class: "run-table" }, h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))), h("tbody", {}, body)),
      starred ? h("p", { class: "sub" }, "* no interval: " + run.rows.find((r) => r.interval_note).interval_note) : null);
  }

  function runView() {
    const runs = DATA.runs;
    const box = h("div", { id: "run-view" }, notes(DATA.notes));
    box.appendChild(h("div", { class: "runs" }, runs.map((run) => h("div", { class: "run" },
      h("h2", {}, run.name, " ", h("span", { class: "badge " + (run.finished ? "ok" : "bad") }, run.kind === "missing" ? "not found" : run.finished ? "finished" : "in progress")),
      h("div", { class: "sub" }, [run.dir, run.method && `method ${run.method}`, run.mode && `mode ${run.mode}`, run.iterations_planned !== null && run.iterations_planned !== undefined && `${run.iterations_planned} iteration(s) planned`].filter(Boolean).join(" · ")),
      notes(run.notes),
      h("div", { id: "run-table-" + run.index }, runTable(run)),
      h("h3", {}, "Trajectories"),
      h("ul", {}, (run.sets || []).map((st, i) => h("li", {}, h("a", { href: `#questions&set=${run.index}:${i}` }, st.label), ` (${st.n})`, st.note ? h("span", { class: "err" }, " " + st.note) : null))),
      run.config_text !== null && run.config_text !== undefined ? h("details", {}, h("summary", {}, "config.yaml (the config the run used)"), h("pre", {}, run.config_text)) : h("p", { class: "empty" }, "No config recorded.")))));
    const withRows = runs.filter((r) => r.rows && r.rows.length);
    if (withRows.length) {
      const mk = (key) => withRows.map((r) => ({ label: `${r.name}${r.mode ? " (" + (r.mode === "backtrace" ? "backtracing" : r.mode === "star" ? "STaR" : r.mode) + ")" : ""}`, x: r.series[key + "_x"], y: r.series[key + "_y"], iv: r.series.em_iv, dash: r.mode === "star" }));
      box.appendChild(h("h2", {}, "Figure 2: dev EM and FA ratio per iteration"));
      box.appendChild(h("div", { class: "charts" }, chart("(a) dev EM (95% interval bars)", "dev EM", mk("em"), true), chart("(b) FA ratio of the rollouts", "FA ratio", mk("fa"), false)));
    }
    return box;
  }

  // -- the traced graph: a layered layout from the initial entities ------------------------------
  function layout(g) {
    const adj = new Map(g.nodes.map((n) => [n.key, []]));
    g.edges.forEach((e) => { adj.get(e.s).push(e.o); adj.get(e.o).push(e.s); });
    const depth = new Map();
    const bfs = (starts) => {
      const q = [...starts];
      starts.forEach((k) => depth.set(k, 0));
      while (q.length) { const u = q.shift(); for (const v of adj.get(u)) if (!depth.has(v)) { depth.set(v, depth.get(u) + 1); q.push(v); } }
    };
    bfs(g.nodes.filter((n) => n.initial).map((n) => n.key));
    for (const n of g.nodes) if (!depth.has(n.key)) bfs([n.key]);
    const cols = [];
    g.nodes.forEach((n) => { const d = depth.get(n.key); (cols[d] = cols[d] || []).push(n.key); });
    const pos = new Map();
    cols.forEach((c) => c.forEach((k, i) => pos.set(k, i)));
    for (let sweep = 0; sweep < 4; sweep++) {
      for (let d = 1; d < cols.length; d++) {
        const bary = (k) => { const ns = adj.get(k).filter((v) => depth.get(v) === d - 1); return ns.length ? ns.reduce((a, v) => a + pos.get(v), 0) / ns.length : pos.get(k); };
        cols[d].sort((a, b) => bary(a) - bary(b));
        cols[d].forEach((k, i) => pos.set(k, i));
      }
    }
    // columns as wide as the view allows (labels need room between the boxes), scrolling beyond that
    const CW = Math.max(210, Math.min(290, (window.innerWidth - 560 - 170) / Math.max(1, cols.length - 1)));
    const RH = 64, rows = Math.max(...cols.map((c) => c.length));
    const xy = new Map();
    cols.forEach((c, d) => c.forEach((k, i) => xy.set(k, [20 + d * CW, 30 + (i + (rows - c.length) / 2) * RH])));
    return { xy, width: 60 + (cols.length - 1) * CW + 170, height: 40 + rows * RH };
  }

  function graphSvg(g) {
    const { xy, width, height } = layout(g);
    const NW = 170, NH = 30;
    const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "kg-svg" });
    const defs = s("defs");
    [["arrow", "#8a93a6"], ["arrow-ev", "#1f9d55"]].forEach(([id, c]) => {
      const m = s("marker", { id, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
      m.appendChild(s("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: c }));
      defs.appendChild(m);
    });
    svg.appendChild(defs);
    const seen = new Map(), placed = [];
    g.edges.forEach((e) => {
      const [x1, y1] = xy.get(e.s), [x2, y2] = xy.get(e.o);
      const pairKey = [e.s, e.o].sort().join("\u0000");
      const n = seen.get(pairKey) || 0; seen.set(pairKey, n + 1);
      const ax = x1 + NW / 2, ay = y1 + NH / 2, bx = x2 + NW / 2, by = y2 + NH / 2;
      const self = e.s === e.o;
      const dx = bx - ax, dy = by - ay, len = Math.hypot(dx, dy) || 1;
      const bend = (n % 2 ? -1 : 1) * Math.ceil(n / 2) * 40 + (Math.abs(dx) < 1 ? 60 : 0);
      const mx = (ax + bx) / 2 - (dy / len) * bend, my = (ay + by) / 2 + (dx / len) * bend;
      // end the arrow at the box's border
      const tx = bx - mx, ty = by - my, tl = Math.hypot(tx, ty) || 1;
      const k = Math.min((NW / 2) / Math.abs(tx / tl || 1e-9), (NH / 2) / Math.abs(ty / tl || 1e-9));
      const ex = bx - (tx / tl) * k, ey = by - (ty / tl) * k;
      const cls = "edge" + (e.evidence ? " evidence" : "") + (e.dropped ? " dropped" : "");
      const grp = s("g", { class: cls, "data-i": e.i });
      const d = self ? `M ${ax} ${ay - NH / 2} c 40 -50 80 -10 ${NW / 2 - 10} ${NH / 2 - 4}` : `M ${ax} ${ay} Q ${mx} ${my} ${ex} ${ey}`;
      grp.appendChild(s("path", { d, fill: "none", stroke: e.evidence ? "#1f9d55" : e.dropped ? "#c88" : "#8a93a6", "stroke-width": e.evidence ? 3 : 1.3, "stroke-dasharray": e.dropped ? "5 4" : null, "marker-end": `url(#${e.evidence ? "arrow-ev" : "arrow"})` }));
      const lx = self ? ax + 30 : (ax + 2 * mx + bx) / 4;
      let ly = self ? ay - NH / 2 - 24 : (ay + 2 * my + by) / 4;
      // nudge the label off the labels placed before it (greedy, a few steps of one line)
      const lw = 5.6 * Math.min(e.relation.length, 30);
      for (let step = 0; step < 8 && placed.some(([px, py, pw]) => Math.abs(px - lx) < (pw + lw) / 2 && Math.abs(py - ly) < 12); step++) ly += 12;
      placed.push([lx, ly, lw]);
      const lab = s("text", { x: lx, y: ly - 3, "text-anchor": "middle", "font-size": 10, fill: e.evidence ? "#146c3a" : e.dropped ? "#a55" : "#4a5366", "text-decoration": e.dropped ? "line-through" : null, "font-weight": e.evidence ? 600 : null, stroke: "#fcfcfe", "stroke-width": 3, "paint-order": "stroke" }, cut(e.relation, 30));
      grp.appendChild(lab);
      grp.appendChild(s("title", {}, `(${e.subject}; ${e.relation}; ${e.object})  round ${e.round}, call ${e.call}` + (e.evidence ? " · evidence" : "") + (e.dropped ? " · " + g.dropped_label : "")));
      svg.appendChild(grp);
    });
    g.nodes.forEach((n) => {
      const [x, y] = xy.get(n.key);
      const cls = "node" + (n.initial ? " initial" : "") + (n.target ? " target" : "");
      const grp = s("g", { class: cls });
      grp.appendChild(s("rect", { x, y, width: NW, height: NH, rx: 7, fill: n.initial ? "#dbe7ff" : n.target ? "#fff1c7" : "#fff", stroke: n.target ? "#d99a00" : n.initial ? "#2f6fdb" : "#a3abbd", "stroke-width": n.target || n.initial ? 2.5 : 1.2 }));
      grp.appendChild(s("text", { x: x + NW / 2, y: y + NH / 2 + 4, "text-anchor": "middle", "font-size": 11 }, cut(n.label, 27)));
      grp.appendChild(s("title", {}, n.label + (n.initial ? " · initial entity" : "") + (n.target ? " · target entity" : "")));
      svg.appendChild(grp);
    });
    return svg;
  }

  // -- the question view ---------------------------------------------------------------------------
  const state = { q: null, run: "", set: "", correct: "", dataset: "", hops: "", text: "" };

  function filtered() {
    const t = state.text.toLowerCase();
    return DATA.questions.filter((q) => (state.run === "" || String(q.run) === state.run)
      && (state.set === "" || `${q.run}:${q.set}` === state.set)
      && (state.correct === "" || String(q.correct) === state.correct)
      && (state.dataset === "" || q.dataset === state.dataset)
      && (state.hops === "" || String(q.hops) === state.hops)
      && (!t || (q.question + " " + q.id + " " + (q.prediction || "") + " " + q.answers.join(" ")).toLowerCase().includes(t)));
  }

  function select(label, key, options) {
    const sel = h("select", { "aria-label": label, "data-filter": key });
    sel.appendChild(h("option", { value: "" }, label + ": all"));
    options.forEach(([v, text]) => { const o = h("option", { value: v }, text); if (String(v) === state[key]) o.selected = true; sel.appendChild(o); });
    sel.addEventListener("change", () => { state[key] = sel.value; renderList(); });
    return sel;
  }

  function setLabel(q) { const r = DATA.runs[q.run]; return (DATA.runs.length > 1 ? r.name + " · " : "") + ((r.sets || [])[q.set] || {}).label; }

  function renderList() {
    const list = document.getElementById("qlist-rows");
    if (!list) return;
    list.textContent = "";
    const qs = filtered();
    document.getElementById("qcount").textContent = `${qs.length} of ${DATA.questions.length} trajectories` + (qs.length > 2000 ? " (the first 2000 listed: filter to see the rest)" : "");
    qs.slice(0, 2000).forEach((q) => list.appendChild(h("div", { class: "qrow" + (state.q === q.key ? " sel" : ""), "data-key": q.key, onclick: () => { location.hash = "q=" + q.key; } },
      h("span", { class: "badge " + (q.correct ? "ok" : "bad") }, q.correct ? "✓" : "✗"), cut(q.question, 110),
      h("div", { class: "meta" }, [setLabel(q), q.dataset, q.hops !== null ? q.hops + " hops" : null, q.graph ? null : "no graph"].filter(Boolean).join(" · ")))));
  }

  function passageBox(pid) {
    const p = DATA.passages[pid];
    return h("div", { class: "passage" }, h("b", {}, p ? p.title : pid), p ? h("span", {}, " — " + cut(p.text, 400)) : h("span", { class: "empty" }, " (text not in the report: no corpus found)"));
  }

  function answerLine(c) {
    const p = c.parsed && typeof c.parsed === "object" ? c.parsed : {};
    if (!p.answer && !p.thought) return null;
    return h("div", { class: c.dropped_all ? "dropped" : "" }, p.thought ? h("div", {}, h("b", {}, "thought: "), String(p.thought)) : null,
      p.answer ? h("div", {}, h("b", {}, "answer: "), String(p.answer)) : null);
  }

  function callBox(c, q) {
    const items = c.items.length ? h("ul", { class: "items" }, c.items.map((it) => h("li", { class: it.dropped ? "dropped" : (q.explain && q.correct ? "kept" : "") }, it.text))) : null;
    return h("div", { class: "call" + (c.dropped_all ? " dropped-all" : ""), "data-call": c.index },
      h("span", { class: "role" }, c.role), h("span", { class: "sub" }, `call ${c.index} · ${c.prompt_tokens} → ${c.output_tokens} tokens · ${c.finish_reason}`),
      c.dropped_all ? h("span", { class: "badge bad" }, "record dropped by the filters") : null,
      c.pair ? h("div", {}, h("b", {}, "guidance pair: "), `${c.pair[0]}: ${c.pair[1]}`) : null,
      c.passage_ids.length ? h("details", {}, h("summary", {}, `${c.passage_ids.length} retrieved passage(s)`), c.passage_ids.map(passageBox)) : null,
      items,
      answerLine(c),
      c.dropped_items.length ? h("div", {}, "removed by the filters: ", c.dropped_items.map((t) => h("span", { class: "dropped" }, t + " "))) : null,
      c.error ? h("div", { class: "err" }, "unusable: " + c.error) : null,
      h("details", { open: !c.items.length && !answerLine(c) }, h("summary", {}, "output"), h("pre", { class: "out" }, c.output)),
      h("details", {}, h("summary", {}, "prompt"), h("pre", {}, c.prompt)));
  }

  function questionView(q) {
    const box = h("div", { class: "qview", id: "question-view", "data-key": q.key });
    box.appendChild(h("div", { class: "question" }, q.question));
    box.appendChild(h("div", { class: "kv" },
      h("span", { class: "k" }, "gold"), h("span", {}, q.answers.join(" | ")),
      h("span", { class: "k" }, "predicted"), h("span", {}, h("span", { class: "badge " + (q.correct ? "ok" : "bad") }, q.correct ? "correct" : "incorrect"), q.prediction === null ? h("i", {}, "no answer") : q.prediction),
      h("span", { class: "k" }, "thought"), h("span", {}, q.thought || "-"),
      [["trajectory", q.id], ["set", setLabel(q)], ["method", q.strategy], ["dataset", q.dataset], ["hops", q.hops], ["kind", q.kind], ["EM / F1", `${fmt(q.em, 2)} / ${fmt(q.f1, 2)}`], ["stop", q.stop_reason], ["rounds", q.rounds], ["seconds", q.wall_time]]
        .map(([k, v]) => [h("span", { class: "k" }, k), h("span", {}, v === null || v === undefined ? "-" : String(v))])));
    if (q.meta && Object.keys(q.meta).length) box.appendChild(h("details", {}, h("summary", {}, "meta"), h("table", {}, Object.entries(q.meta).map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, typeof v === "string" ? v : JSON.stringify(v)))))));
    box.appendChild(h("h3", {}, "Traced knowledge graph"));
    const ex = q.explain;
    if (ex) box.appendChild(h("div", { class: "sub" }, `${ex.traced_by || "backtracing"}: ${ex.status}` + (ex.path_rule ? ` (path rule ${ex.path_rule})` : "") + ` · ${(ex.evidence || []).length} evidence triplet(s)` + (ex.note ? " · " + ex.note : "")));
    if (q.explain_note) box.appendChild(h("div", { class: "sub" }, q.explain_note));
    if (!q.graph) box.appendChild(h("p", { class: "empty", id: "no-graph" }, "No graph: this trajectory traced no triplet and no entity."));
    else {
      box.appendChild(h("div", { class: "legend" }, h("span", {}, h("i", { style: "background:#dbe7ff;border:2px solid #2f6fdb" }), "initial entity"), h("span", {}, h("i", { style: "background:#fff1c7;border:2px solid #d99a00" }), "target entity"),
        h("span", {}, h("i", { style: "background:#1f9d55" }), "evidence subgraph"), h("span", {}, h("i", { style: "background:repeating-linear-gradient(90deg,#c88 0 4px,#fff 4px 7px)" }), q.graph.dropped_label)));
      box.appendChild(h("div", { class: "graphbox", id: "graph" }, graphSvg(q.graph)));
      if (q.graph.edges.length) box.appendChild(h("details", { open: true }, h("summary", {}, `${q.graph.edges.length} triplet(s)`), h("table", { id: "triplet-table" },
        h("tr", {}, ["#", "subject", "relation", "object", "round", "call", "guidance pair"].map((c) => h("th", {}, c))),
        q.graph.edges.map((e) => h("tr", { class: e.evidence ? "ev" : e.dropped ? "drop" : "" }, h("td", {}, e.i), h("td", {}, e.subject), h("td", {}, e.relation), h("td", {}, e.object), h("td", {}, e.round), h("td", {}, e.call), h("td", {}, e.pair ? `${e.pair[0]}: ${e.pair[1]}` : "-"))))));
    }
    box.appendChild(h("h3", {}, "Rounds"));
    if (!q.calls.length) box.appendChild(h("p", { class: "empty" }, "No model call recorded."));
    const rounds = [...new Set(q.calls.map((c) => c.round))].sort((a, b) => a - b);
    rounds.forEach((r) => box.appendChild(h("div", { class: "round" }, h("b", {}, `round ${r}`), q.calls.filter((c) => c.round === r).map((c) => callBox(c, q)))));
    return box;
  }

  function questionsView() {
    const datasets = [...new Set(DATA.questions.map((q) => q.dataset))].sort();
    const hops = [...new Set(DATA.questions.map((q) => q.hops).filter((x) => x !== null))].sort((a, b) => a - b);
    const sets = DATA.runs.flatMap((r) => (r.sets || []).map((st, i) => [r.index, i, (DATA.runs.length > 1 ? r.name + " · " : "") + st.label]));
    const search = h("input", { type: "search", placeholder: "search question, id, answer", value: state.text, "aria-label": "search" });
    search.addEventListener("input", () => { state.text = search.value; renderList(); });
    const setSel = select("set", "set", sets.map(([r, i, l]) => [`${r}:${i}`, l]));
    const left = h("div", { class: "qlist" }, h("div", { class: "filters" }, search,
      DATA.runs.length > 1 ? select("run", "run", DATA.runs.map((r) => [r.index, r.name])) : null, setSel,
      select("answer", "correct", [["true", "correct"], ["false", "incorrect"]]), select("dataset", "dataset", datasets.map((d) => [d, d])), select("hops", "hops", hops.map((x) => [x, x + " hops"]))),
      h("div", { id: "qcount", class: "sub" }), h("div", { id: "qlist-rows" }));
    const q = DATA.questions.find((x) => x.key === state.q);
    const right = q ? questionView(q) : h("div", { class: "qview" }, h("p", { class: "empty" }, DATA.questions.length ? "Pick a question on the left." : "No trajectory in these records."));
    return h("div", { class: "qlayout" }, left, right);
  }

  // -- routing: #runs, #questions&run=..&set=.., #q=<key> ------------------------------------------
  function render() {
    const hash = decodeURIComponent(location.hash.replace(/^#/, ""));
    const params = new URLSearchParams(hash.replace(/^[a-z]+(&|$)/, ""));
    let view = "runs";
    if (hash.startsWith("q=")) { view = "questions"; state.q = Number(new URLSearchParams(hash).get("q")); }
    else if (hash.startsWith("questions")) { view = "questions"; if (params.has("set")) { state.set = params.get("set"); state.run = ""; } }
    const app = document.getElementById("app");
    app.textContent = "";
    app.appendChild(h("header", {}, h("h1", {}, DATA.title), h("nav", {}, h("a", { href: "#runs", class: view === "runs" ? "active" : "" }, "Runs"), h("a", { href: "#questions", class: view === "questions" ? "active" : "" }, `Questions (${DATA.questions.length})`)), h("span", { class: "gen" }, "generated " + DATA.generated)));
    app.appendChild(h("main", {}, view === "runs" ? runView() : questionsView()));
    renderList();
    document.title = DATA.title;
  }
  window.addEventListener("hashchange", render);
  render();
})();
