// The dashboard's behaviour: sortable tables and the Plotly charts.
// Data arrives in <script type="application/json"> blocks and is read with JSON.parse(textContent); text
// from runs is only ever set with textContent, or escaped before Plotly (which reads a little HTML) sees it.
(function () {
  "use strict";

  const base = document.body.dataset.base || "";
  const colors = { a: "#1f6fb2", b: "#d9480f", floor: "#868e96" };

  function readJSON(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  // Plotly renders <br>, <b>, entities... in labels; run content must reach it as plain text.
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function fmt(v, digits) {
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    return Number(v.toPrecision(digits || 3)).toString();
  }

  function chartsMissing(el) {
    el.classList.add("no-chart");
    el.textContent = "Charts need plotly.min.js, which this server could not find (install the plotly package).";
  }

  const plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  const baseLayout = {
    margin: { l: 60, r: 20, t: 10, b: 50 },
    font: { family: "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 12 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "#fff",
    legend: { orientation: "h", y: 1.12 },
  };

  function plot(id, traces, layout) {
    const el = document.getElementById(id);
    if (!el) return null;
    if (!window.Plotly) {
      chartsMissing(el);
      return null;
    }
    window.Plotly.newPlot(el, traces, Object.assign({}, baseLayout, layout), plotConfig);
    el.dataset.rendered = "1";
    return el;
  }

  // -- sortable tables ---------------------------------------------------------------------------
  function cellValue(td, numeric) {
    const raw = td.dataset.v !== undefined ? td.dataset.v : td.textContent.trim();
    if (!numeric) return raw.toLowerCase();
    if (raw === "inf") return Infinity;
    if (raw === "-inf") return -Infinity;
    const x = parseFloat(raw);
    return Number.isNaN(x) ? null : x;
  }

  function makeSortable(table) {
    const heads = Array.from(table.tHead.rows[0].cells);
    heads.forEach(function (th, col) {
      if (th.dataset.sort === "none") return;
      th.classList.add("sortable-col");
      th.tabIndex = 0;
      const sort = function () {
        const numeric = th.dataset.sort === "num";
        const dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        rows.sort(function (r1, r2) {
          const x = cellValue(r1.cells[col], numeric);
          const y = cellValue(r2.cells[col], numeric);
          if (x === y) return 0;
          if (x === null) return 1; // empty cells last, either direction
          if (y === null) return -1;
          return (x < y ? -1 : 1) * dir;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
    });
  }

  // -- comparison: the drift heatmap -------------------------------------------------------------
  function decadeTicks(zmin, zmax, ratio) {
    const vals = [];
    const text = [];
    for (let k = Math.ceil(zmin); k <= Math.floor(zmax); k++) {
      vals.push(k);
      const v = k >= 0 ? String(Math.pow(10, k)) : Math.pow(10, k).toFixed(-k);
      text.push(ratio ? v + "×" : "1e" + k);
    }
    return { vals: vals, text: text };
  }

  function drawHeatmap() {
    const d = readJSON("heatmap-data");
    if (!d || !d.heatmap || !document.getElementById("heatmap")) return;
    const h = d.heatmap;
    const ratio = h.center !== null;
    const zs = h.z.flat().filter(function (v) { return v !== null; });
    let zmin = zs.length ? Math.min.apply(null, zs) : -1;
    let zmax = zs.length ? Math.max.apply(null, zs) : 0;
    if (ratio) {
      const m = Math.max(Math.abs(zmin), Math.abs(zmax), 0.5);
      zmin = -m;
      zmax = m;
    } else if (zmax - zmin < 1) {
      zmin -= 0.5;
      zmax += 0.5;
    }
    const hover = h.z.map(function (row, r) {
      return row.map(function (z, c) {
        if (h.pair[r][c] === null) return "";
        let s = esc(h.rows[r]) + " · " + esc(h.cols[c]) + "<br>" + esc(h.metric) + " = " + esc(h.text[r][c]) + "<br>status: " + esc(h.status[r][c]);
        if (h.step && h.step[r][c] !== null) s += " (step " + h.step[r][c] + ")";
        if (h.count[r][c] > 1) {
          s += "<br>worst of " + h.count[r][c] + " pairs";
          if (h.fails && h.fails[r][c]) s += ", " + h.fails[r][c] + " failing";
          s += "<br>click to list them";
        }
        return s;
      });
    });
    const ticks = decadeTicks(zmin, zmax, ratio);
    const cells = h.rows.length * h.cols.length;
    // a value printed in each cell only while cells are wide enough to hold it (not at 93 layers)
    const labels = cells <= 400 && h.cols.length <= 24;
    const trace = {
      type: "heatmap",
      z: h.z,
      x: h.cols.map(esc),
      y: h.rows.map(esc),
      text: h.text,
      texttemplate: labels ? "%{text}" : "",
      textfont: { size: 10 },
      hovertext: hover,
      hoverinfo: "text",
      zmin: zmin,
      zmax: zmax,
      xgap: 2,
      ygap: 2,
      colorscale: ratio
        ? [[0, "#2166ac"], [0.35, "#92c5de"], [0.5, "#f7f7f7"], [0.65, "#f4a582"], [1, "#b2182b"]]
        : "Viridis",
      colorbar: { title: { text: esc(h.metric), side: "right" }, tickvals: ticks.vals, ticktext: ticks.text, thickness: 14 },
    };
    // cells with a pair but no value for this metric (no floor, an error): grey, still hoverable and clickable
    const blank = h.z.map(function (row, r) {
      return row.map(function (z, c) { return h.pair[r][c] !== null && z === null ? 0 : null; });
    });
    const underlay = {
      type: "heatmap", z: blank, x: trace.x, y: trace.y, showscale: false, xgap: 2, ygap: 2,
      colorscale: [[0, "#dee2e6"], [1, "#dee2e6"]], zmin: 0, zmax: 1, hovertext: hover, hoverinfo: "text",
      text: blank.map(function (row) { return row.map(function (v) { return v === null ? "" : "n/a"; }); }),
      texttemplate: labels ? "%{text}" : "", textfont: { size: 10, color: "#68717a" },
    };
    const shapes = [];
    const annotations = [];
    if (h.first) {
      const f = h.first;
      shapes.push({
        type: "rect", xref: "x", yref: "y", x0: f.col - 0.5, x1: f.col + 0.5, y0: f.row - 0.5, y1: f.row + 0.5,
        line: { color: f.kind === "limit" ? "#000" : "#e67700", width: 3 },
      });
      annotations.push({
        x: f.col, y: f.row - 0.5, xref: "x", yref: "y", text: f.kind === "limit" ? "first beyond limit" : "first above floor",
        showarrow: true, arrowhead: 2, ax: 0, ay: -22, bgcolor: "#fff", bordercolor: "#000", font: { size: 11 },
      });
    }
    const el = plot("heatmap", [underlay, trace], {
      height: Math.max(260, 34 * h.rows.length + 130),
      margin: { l: 12 + 7 * Math.max.apply(null, h.rows.map(function (r) { return r.length; }).concat([8])), r: 20, t: 20, b: 90 },
      xaxis: { type: "category", tickangle: h.cols.length > 8 ? -40 : 0, automargin: true },
      yaxis: { type: "category", autorange: "reversed", automargin: true },
      shapes: shapes,
      annotations: annotations,
    });
    if (el) {
      el.on("plotly_click", function (ev) {
        const pt = ev.points && ev.points[0];
        if (!pt) return;
        const r = pt.pointIndex[0];
        const c = pt.pointIndex[1];
        const idx = h.pair[r][c];
        if (idx === null || idx === undefined) return;
        if (h.count[r][c] > 1) { // several pairs (steps...): list them in the table, worst first
          const url = new URL(window.location.href);
          url.searchParams.set("name", h.rows[r]);
          url.searchParams.set("where", h.cols[c]);
          ["page", "status", "sort", "dir"].forEach(function (k) { url.searchParams.delete(k); });
          url.hash = "pair-list";
          window.location.href = url.toString();
        } else {
          window.location.href = base + "/comparisons/" + encodeURIComponent(d.comparison) + "/pairs/" + encodeURIComponent(idx);
        }
      });
    }
  }

  // -- pair drill-down -----------------------------------------------------------------------------
  function axisTrace(axis, offset, name, color, kind) {
    const x = axis.start.map(function (s) { return s + offset; });
    const hover = axis.start.map(function (s, i) {
      const end = Math.min(s + axis.bucket, axis.length) - 1;
      const where = axis.bucket > 1 ? (s + offset) + "…" + (end + offset) : String(s + offset);
      return esc(name) + "<br>" + (axis.axis === 0 ? "token " : "head ") + where + "<br>rel_l2 " + fmt(axis.rel_l2[i], 4) + "<br>||B−A|| " + fmt(axis.abs_l2[i], 4);
    });
    const t = { x: x, y: axis.rel_l2, name: esc(name), hovertext: hover, hoverinfo: "text", marker: { color: color } };
    if (kind === "bar") return Object.assign(t, { type: "bar" });
    return Object.assign(t, { type: "scatter", mode: axis.length > 200 ? "lines" : "lines+markers", line: { color: color, width: 1.5 } });
  }

  // a log axis when the values span more than ~1.5 decades, else linear (easier to read)
  function axisType(values) {
    const pos = values.filter(function (v) { return v !== null && v > 0; });
    if (!pos.length) return "linear";
    return Math.max.apply(null, pos) / Math.min.apply(null, pos) > 30 ? "log" : "linear";
  }

  function drawPair() {
    const d = readJSON("pair-data");
    if (!d || !d.profile) return;
    const p = d.profile;
    const fp = d.floor_profile;
    if (p.tokens) {
      const traces = [axisTrace(p.tokens, d.token_offset, "B vs A", colors.b, "line")];
      if (fp && fp.tokens) traces.push(Object.assign(axisTrace(fp.tokens, d.token_offset, "noise floor", colors.floor, "line"), { line: { color: colors.floor, dash: "dot", width: 1.5 } }));
      plot("tokens-chart", traces, {
        height: 300,
        xaxis: { title: { text: "token position" }, zeroline: false, rangemode: "tozero" },
        yaxis: { title: { text: "rel_l2 of the row" }, type: axisType(p.tokens.rel_l2), exponentformat: "e" },
      });
    }
    if (p.heads) {
      const traces = [axisTrace(p.heads, 0, "B vs A", colors.b, "bar")];
      if (fp && fp.heads) traces.push(Object.assign(axisTrace(fp.heads, 0, "noise floor", colors.floor, "line"), { mode: "markers", marker: { color: colors.floor, symbol: "line-ew-open", size: 14, line: { width: 2 } } }));
      plot("heads-chart", traces, {
        height: 300,
        xaxis: { title: { text: "head" }, dtick: p.heads.length > 32 ? undefined : 1 },
        yaxis: { title: { text: "rel_l2 of the head" }, type: axisType(p.heads.rel_l2), exponentformat: "e" },
      });
    }
    const hist = function (prof) {
      const xs = [];
      const ys = [];
      const hover = [];
      prof.hist_counts.forEach(function (c, i) {
        if (!c) return;
        xs.push(Math.log10(prof.hist_edges[i]) + 0.125);
        ys.push(c);
        hover.push("|B−A| in [" + fmt(prof.hist_edges[i], 2) + ", " + fmt(prof.hist_edges[i + 1], 2) + ")<br>" + c + " elements");
      });
      return { x: xs, y: ys, hovertext: hover };
    };
    const hb = hist(p);
    const traces = [Object.assign({ type: "bar", width: 0.24, hoverinfo: "text", name: "B vs A", marker: { color: colors.b, opacity: 0.85 } }, hb)];
    let xs = hb.x;
    if (fp) {
      const hf = hist(fp);
      xs = xs.concat(hf.x);
      traces.push(Object.assign({ type: "bar", width: 0.24, hoverinfo: "text", name: "noise floor",
        marker: { color: "rgba(0,0,0,0)", line: { color: colors.floor, width: 2 } } }, hf));
    }
    const ticks = decadeTicks(xs.length ? Math.min.apply(null, xs) - 0.2 : 0, xs.length ? Math.max.apply(null, xs) + 0.2 : 0, false);
    plot("hist-chart", traces, {
      height: 300,
      barmode: "overlay",
      showlegend: !!fp,
      xaxis: { title: { text: "|B − A| (log scale)" }, tickvals: ticks.vals, ticktext: ticks.text },
      yaxis: { title: { text: "elements" } },
    });
  }

  // -- acceptance ----------------------------------------------------------------------------------
  function band(xs, ci, color, name) {
    return [
      { x: xs, y: ci.map(function (c) { return c[1]; }), type: "scatter", mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false },
      { x: xs, y: ci.map(function (c) { return c[0]; }), type: "scatter", mode: "lines", line: { width: 0 }, fill: "tonexty",
        fillcolor: color + "33", hoverinfo: "skip", name: name + " interval", showlegend: false },
    ];
  }

  function drawAcceptance() {
    const d = readJSON("acceptance-data");
    if (!d || !d.acceptance) return;
    const acc = d.acceptance;
    const pos = acc.positions;
    const xs = pos.map(function (p) { return p.position; });
    const nameA = "A: " + d.a;
    const nameB = "B: " + d.b;
    const line = function (key, ci, reached, color, name) {
      return {
        x: xs, y: pos.map(function (p) { return p[key]; }), type: "scatter", mode: "lines+markers", name: esc(name),
        line: { color: color, width: 2 }, marker: { color: color, size: 7 },
        hovertext: pos.map(function (p) {
          return esc(name) + "<br>position " + p.position + ": " + fmt(p[key], 4) + " [" + fmt(p[ci][0], 3) + ", " + fmt(p[ci][1], 3) + "]<br>reached " + p[reached];
        }),
        hoverinfo: "text",
      };
    };
    plot("positions-chart", [
      ...band(xs, pos.map(function (p) { return p.ci_a; }), colors.a, nameA),
      line("rate_a", "ci_a", "reached_a", colors.a, nameA),
      ...band(xs, pos.map(function (p) { return p.ci_b; }), colors.b, nameB),
      line("rate_b", "ci_b", "reached_b", colors.b, nameB),
    ], {
      height: 320,
      legend: { orientation: "h", y: 1.12, traceorder: "normal" },
      xaxis: { title: { text: "draft position" }, dtick: 1, zeroline: false },
      yaxis: { title: { text: "P(accepted | reached)" }, rangemode: "tozero" },
    });
    const ha = acc.summary_a.histogram;
    const hb = acc.summary_b.histogram;
    const bins = Math.max(ha.length, hb.length);
    const share = function (h) {
      const n = h.reduce(function (s, x) { return s + x; }, 0) || 1;
      return Array.from({ length: bins }, function (_, i) { return (h[i] || 0) / n; });
    };
    const bar = function (h, color, name) {
      const sh = share(h);
      return {
        type: "bar", x: Array.from({ length: bins }, function (_, i) { return i; }), y: sh, name: esc(name), marker: { color: color },
        hovertext: sh.map(function (s, i) { return esc(name) + "<br>" + i + " accepted: " + (h[i] || 0) + " steps (" + fmt(100 * s, 3) + "%)"; }),
        hoverinfo: "text",
      };
    };
    plot("histogram-chart", [bar(ha, colors.a, nameA), bar(hb, colors.b, nameB)], {
      height: 320,
      barmode: "group",
      xaxis: { title: { text: "drafts accepted in the step" }, dtick: 1 },
      yaxis: { title: { text: "share of verify steps" }, tickformat: ".0%" },
    });
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  // the drift map's step selector: choosing a step shows it (the button stays for keyboards / no script)
  const stepSelect = document.getElementById("step-select");
  if (stepSelect) stepSelect.addEventListener("change", function () { stepSelect.form.submit(); });
  const page = document.body.dataset.page;
  if (page === "comparison") drawHeatmap();
  if (page === "pair") drawPair();
  if (page === "acceptance") drawAcceptance();
})();
