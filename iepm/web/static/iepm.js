// Draw every chart whose spec the server embedded in the page (uPlot, no external resources).
// Each chart is kept in window.iepmCharts[id] so that tests and people can inspect it.
(function () {
  "use strict";
  const charts = {};
  window.iepmCharts = charts;
  const colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];

  // 941000000 -> "941M": axis labels stay short whatever the unit.
  function si(v) {
    if (v == null) return "";
    const a = Math.abs(v);
    const steps = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [s, p] of steps) if (a >= s) return +(v / s).toPrecision(3) + p;
    return +v.toPrecision(3) + "";
  }

  // Times in UTC, ISO style and 24-hour, whatever the browser's locale.
  function iso(t) {
    return new Date(t * 1000).toISOString().slice(0, 16).replace("T", " ");
  }
  // Time axis ticks: hours within a day, the date where a day starts (and on the first tick).
  function timeTicks(u, splits, axis, space, incr) {
    return splits.map((t, i) => {
      // Ticks under a minute apart (a zoomed hour) need their seconds to differ.
      const s = incr < 60 ? new Date(t * 1000).toISOString().slice(0, 19).replace("T", " ") : iso(t);
      if (incr >= 86400) return (i === 0 || s.slice(5, 10) === "01-01") ? s.slice(0, 10) : s.slice(5, 10);
      return (i === 0 || s.slice(11) === "00:00") ? s.slice(0, 10) + "\n" + s.slice(11) : s.slice(11);
    });
  }

  // Outages: the periods a probe's runs failed, shaded; their reason is shown on hover (in
  // the chart's .reason line, and in window.iepmCharts[id].iepmOutage).
  // Within a few pixels: an outage of one run on a 28-day chart is a pixel wide, and the
  // cursor snaps to the nearest run.
  function outageAt(u, outages, left) {
    const slack = 4;
    return outages.find(o => left >= u.valToPos(o.from, "x") - slack &&
                             left <= u.valToPos(o.to, "x") + slack) || null;
  }

  // Route changes: dashed red lines. Step-change alerts: solid orange lines with a triangle
  // at the top and the alert written beside it. Outages: red shading behind the series.
  function eventLines(events, alerts, outages, reasonEl) {
    return {
      hooks: {
        drawAxes: [u => {
          if (!outages.length) return;
          const ctx = u.ctx;
          ctx.save();
          ctx.fillStyle = "rgba(214, 39, 40, 0.16)";
          for (const o of outages) {
            const a = Math.max(u.bbox.left, u.valToPos(o.from, "x", true));
            const b = Math.min(u.bbox.left + u.bbox.width, u.valToPos(o.to, "x", true));
            if (b < a) continue;
            ctx.fillRect(a, u.bbox.top, Math.max(b - a, 2 * devicePixelRatio), u.bbox.height);
          }
          ctx.restore();
        }],
        setCursor: [u => {
          if (!outages.length || !reasonEl) return;
          const left = u.cursor.left;
          const o = left == null || left < 0 ? null : outageAt(u, outages, left);
          u.iepmOutage = o;
          reasonEl.textContent = o ? `outage ${iso(o.from)} – ${iso(o.to)} UTC: ${o.reason}` : "";
        }],
        draw: [u => {
          if (!events.length && !alerts.length) return;
          const ctx = u.ctx;
          const inside = x => x >= u.bbox.left && x <= u.bbox.left + u.bbox.width;
          ctx.save();
          ctx.strokeStyle = "#b00020";
          ctx.setLineDash([5, 4]);
          ctx.lineWidth = 1.5;
          for (const t of events) {
            const x = Math.round(u.valToPos(t, "x", true));
            if (!inside(x)) continue;
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
          }
          ctx.setLineDash([]);
          ctx.strokeStyle = ctx.fillStyle = "#e07000";
          ctx.font = `${Math.round(11 * devicePixelRatio)}px sans-serif`;
          for (const a of alerts) {
            const x = Math.round(u.valToPos(a.t, "x", true));
            if (!inside(x)) continue;
            const top = u.bbox.top, s = 5 * devicePixelRatio;
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + u.bbox.height);
            ctx.stroke();
            ctx.beginPath();
            ctx.moveTo(x - s, top);
            ctx.lineTo(x + s, top);
            ctx.lineTo(x, top + 1.6 * s);
            ctx.fill();
            ctx.fillText(a.label, x + 1.5 * s, top + 2.5 * s);
          }
          ctx.restore();
        }],
      },
    };
  }

  // Stacked time scales: the time charts of a page (spec.sync names their group) are drawn one
  // below the other on one time axis. They share the hover cursor, a zoom on one zooms all,
  // a double-click on any shows the whole span again, and their plot areas line up (every
  // chart gets as many right-hand axes as the one with most; unused ones are blank).
  const groups = {};  // sync key -> { charts: [uPlot], full: [min, max], rightAxes: n }
  let syncing = false;
  const AXIS_SIZE = 60;

  function rightAxes(spec) {
    if (spec.kind === "smoke") return 0;
    return new Set(spec.series.map(s => s.axis || 1).filter(a => a !== 1)).size;
  }

  function plan(specs) {
    for (const spec of specs) {
      if (!spec.sync || (spec.kind !== "time" && spec.kind !== "smoke")) continue;
      const g = groups[spec.sync] || (groups[spec.sync] = { charts: [], full: null, rightAxes: 0 });
      g.rightAxes = Math.max(g.rightAxes, rightAxes(spec));
      const xs = spec.x.filter(v => v != null);
      if (!xs.length) continue;
      const lo = Math.min(...xs), hi = Math.max(...xs);
      g.full = g.full ? [Math.min(g.full[0], lo), Math.max(g.full[1], hi)] : [lo, hi];
    }
  }

  // Joins a chart's options to its group: shared cursor, padding axes, linked zoom.
  function share(spec, opts) {
    const g = spec.sync && groups[spec.sync];
    if (!g) return null;
    opts.cursor.sync = { key: "iepm-" + spec.sync, setSeries: false };
    // The group's span is the axis: a chart's own one-run range is not kept.
    if (g.full && g.full[0] < g.full[1] && opts.scales.x) delete opts.scales.x.range;
    for (let n = rightAxes(spec); n < g.rightAxes; n++) {
      opts.axes.push({ scale: opts.axes[1].scale || "y", side: 1, label: " ", size: AXIS_SIZE,
                       grid: { show: false }, ticks: { show: false },
                       values: (u, vals) => vals.map(() => "") });
    }
    opts.hooks = opts.hooks || {};
    opts.hooks.setScale = [(u, key) => {
      if (key !== "x" || syncing) return;
      syncing = true;
      try {
        for (const o of g.charts) {
          if (o !== u) o.setScale("x", { min: u.scales.x.min, max: u.scales.x.max });
        }
      } finally {
        syncing = false;
      }
    }];
    // A zoomed chart is being read: auto-refresh waits while any chart of the group is zoomed.
    opts.hooks.setSelect = [u => {
      if (u.select.width > 0) g.charts.forEach(o => { o.iepmZoomed = true; });
    }];
    return g;
  }

  function joined(g, u) {
    if (!g) return;
    g.charts.push(u);
    if (g.full && g.full[0] < g.full[1]) {
      // Start on the whole span of the group, not each chart's own.
      syncing = true;
      u.setScale("x", { min: g.full[0], max: g.full[1] });
      syncing = false;
    }
    u.over.addEventListener("dblclick", () => {
      if (!g.full || !(g.full[0] < g.full[1])) return;
      g.charts.forEach(o => { o.iepmZoomed = false; });
      u.setScale("x", { min: g.full[0], max: g.full[1] });
    });
  }

  // Smokeping's colours for a run's loss, drawn on its median.
  function lossColor(loss) {
    if (loss == null) return "#777";
    if (loss <= 0) return "#1a9850";
    if (loss < 5) return "#1f77b4";
    if (loss < 20) return "#7b3294";
    return "#d62728";
  }

  // The smoke chart: per run, bands between percentiles of its packets' RTTs (0–100, 10–90,
  // 25–75: darker nearer the median) and the median as a dot coloured by the run's loss; a run
  // with no reply is a red tick at the top.
  function buildSmoke(spec, el) {
    const loss = spec.loss || [];
    const reasonEl = el.parentElement.querySelector(".reason");
    const series = [{ label: "time (UTC)", value: (u, v) => v == null ? "–" : iso(v) }];
    const widths = { p50: 1 };
    spec.series.forEach(s => {
      const median = s.label === "p50";
      series.push({ label: s.label, stroke: median ? "#555" : "transparent",
                    width: widths[s.label] || 0, points: { show: false }, spanGaps: false });
    });
    const idx = label => 1 + spec.series.findIndex(s => s.label === label);
    const bands = [["p0", "p100", "rgba(60,60,60,0.10)"], ["p10", "p90", "rgba(60,60,60,0.18)"],
                   ["p25", "p75", "rgba(60,60,60,0.28)"]]
      .filter(([lo, hi]) => idx(lo) > 0 && idx(hi) > 0)
      .map(([lo, hi, fill]) => ({ series: [idx(hi), idx(lo)], fill: fill }));
    const dots = {
      hooks: {
        draw: [u => {
          const ctx = u.ctx, m = idx("p50"), r = 3 * devicePixelRatio;
          ctx.save();
          for (let i = 0; i < spec.x.length; i++) {
            const x = u.valToPos(spec.x[i], "x", true);
            const v = m > 0 ? u.data[m][i] : null;
            ctx.fillStyle = lossColor(loss[i]);
            if (v == null) {
              if (loss[i] == null) continue;
              ctx.fillRect(x - r / 2, u.bbox.top, r, 4 * r);  // no reply at all
              continue;
            }
            ctx.beginPath();
            ctx.arc(x, u.valToPos(v, "y", true), r, 0, 2 * Math.PI);
            ctx.fill();
          }
          ctx.restore();
        }],
      },
    };
    const opts = {
      width: Math.max(320, el.clientWidth || 900),
      height: 260,
      series: series,
      bands: bands,
      legend: { show: true },
      axes: [{ label: spec.xLabel, stroke: "#333", values: timeTicks, space: 70 },
             { stroke: "#333", label: "", values: (u, vals) => vals.map(si), size: AXIS_SIZE }],
      scales: { x: { time: true } },
      cursor: { drag: { x: true, y: false, setScale: true } },
      tzDate: ts => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
      plugins: [eventLines([], [], spec.outages || [], reasonEl), dots],
    };
    opts.hooks = { setSelect: [u => { if (u.select.width > 0) u.iepmZoomed = true; }] };
    const group = share(spec, opts);
    const u = new uPlot(opts, [spec.x, ...spec.series.map(s => s.values)], el);
    u.over.addEventListener("dblclick", () => { u.iepmZoomed = false; });
    joined(group, u);
    charts[spec.id] = u;
    return u;
  }

  function build(spec, el) {
    if (spec.kind === "smoke") return buildSmoke(spec, el);
    const time = spec.kind === "time";
    const series = [{ label: time ? "time (UTC)" : spec.xLabel,
                      value: time ? (u, v) => v == null ? "–" : iso(v) : undefined }];
    const axes = [{ label: spec.xLabel, stroke: "#333", values: time ? timeTicks : (u, vals) => vals.map(si),
                    space: time ? 70 : 50 }];
    const scatterPlot = spec.kind === "scatter";
    // A fit through the origin is only judged by eye when the origin is on the plot.
    const fromZero = (u, min, max) => [0, max > 0 ? max * 1.05 : 1];
    const scales = { x: scatterPlot ? { time: false, range: fromZero } : { time: time } };
    // One distinct x (a single week, a first cycle): uPlot would span years around it.
    const xs = spec.x.filter(v => v != null);
    if (time && xs.length && Math.min(...xs) === Math.max(...xs)) {
      scales.x.range = () => [xs[0] - 3 * 86400, xs[0] + 3 * 86400];
    }
    const seen = {};
    spec.series.forEach((s, i) => {
      const axis = s.axis || 1;
      const scale = axis === 1 ? "y" : "y" + axis;
      const scatter = spec.kind === "scatter" && i === 0;
      const few = spec.x.length < 80;
      const one = {
        label: s.label,
        scale: scale,
        stroke: colors[i % colors.length],
        width: scatter ? 0 : 1.5,
        // Time-of-day profiles join the hours that have data; time series show their gaps.
        spanGaps: spec.kind === "line",
        points: { show: scatter || few || spec.kind === "time", size: scatter ? 6 : 4,
                  fill: colors[i % colors.length] },
      };
      if (scatter) one.paths = () => null;
      if (spec.kind === "bars") {
        one.paths = uPlot.paths.bars({ size: [0.9, 80] });
        one.fill = colors[i % colors.length] + "99";
        one.points = { show: false };
      }
      if (spec.kind === "time" && !few) one.points = { show: false };
      if (axis !== 1) one.dash = [6, 3];
      series.push(one);
      if (!seen[scale]) {
        seen[scale] = true;
        scales[scale] = scatterPlot ? { range: fromZero } : {};
        axes.push({ scale: scale, label: axis === 1 ? "" : s.label, side: axis === 1 ? 3 : 1,
                    grid: { show: axis === 1 }, stroke: axis === 1 ? "#333" : colors[i % colors.length],
                    values: (u, vals) => vals.map(si), size: AXIS_SIZE });
      }
    });
    const opts = {
      width: Math.max(320, el.clientWidth || 900),
      height: 260,
      series: series,
      axes: axes,
      scales: scales,
      cursor: { drag: { x: true, y: false, setScale: true } },
      plugins: [eventLines(spec.events || [], spec.alerts || [], spec.outages || [],
                           el.parentElement.querySelector(".reason"))],
    };
    if (time) opts.tzDate = ts => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC");
    const data = [spec.x, ...spec.series.map(s => s.values)];
    // A zoomed chart is being read: auto-refresh waits until it is zoomed out (double-click).
    opts.hooks = { setSelect: [u => { if (u.select.width > 0) u.iepmZoomed = true; }] };
    const group = share(spec, opts);
    const u = new uPlot(opts, data, el);
    u.over.addEventListener("dblclick", () => { u.iepmZoomed = false; });
    joined(group, u);
    charts[spec.id] = u;
    return u;
  }

  // Auto-refresh of a live page (one without ?until=): reloads every N seconds as chosen in
  // the header (kept in localStorage; default 1 min, within a cached page's life of 30 s
  // plus one refresh), but not while a chart is zoomed or the page is hidden.
  const picker = document.getElementById("refresh");
  if (picker) {
    const KEY = "iepm.refresh";
    const saved = window.localStorage.getItem(KEY);
    const every = saved === null ? 60 : Number(saved);
    if (![...picker.options].some(o => Number(o.value) === every)) {
      picker.add(new Option(`${every} s`, String(every)));
    }
    picker.value = String(every);
    picker.addEventListener("change", () => {
      window.localStorage.setItem(KEY, picker.value);
      window.location.reload();
    });
    if (every > 0) {
      window.setInterval(() => {
        const zoomed = Object.values(charts).some(u => u.iepmZoomed);
        if (!zoomed && document.visibilityState === "visible") window.location.reload();
      }, every * 1000);
    }
  }

  const nodes = [...document.querySelectorAll("script.chart-spec")];
  const specs = nodes.map(node => JSON.parse(node.textContent));
  plan(specs);
  nodes.forEach((node, i) => {
    const spec = specs[i];
    const el = document.getElementById(node.dataset.target);
    try {
      build(spec, el);
    } catch (err) {
      el.textContent = "chart failed: " + err;
    }
  });
  window.addEventListener("resize", () => {
    for (const id in charts) {
      const u = charts[id];
      const w = Math.max(320, u.root.parentElement.clientWidth);
      if (Math.abs(w - u.width) > 20) u.setSize({ width: w, height: u.height });
    }
  });
})();
