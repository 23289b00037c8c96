// The live pages: draw the first picture the server embedded (#live-spec), then follow
// /live/events (server-sent events) and extend it, with no reload. window.iepmLive holds the
// counts and charts so that tests and people can inspect them.
(function () {
  "use strict";
  const node = document.getElementById("live-spec");
  if (!node) return;
  const spec = JSON.parse(node.textContent);
  const colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];
  const state = { spec: spec, events: 0, samples: 0, results: 0, redraws: 0, charts: {},
                  latest: {}, connected: false };
  window.iepmLive = state;
  const statusEl = document.getElementById("live-status");
  const chartsEl = document.getElementById("live-charts");
  const nowS = () => Date.now() / 1000;
  const iso = t => new Date(t * 1000).toISOString().slice(11, 19);
  const fmt = (v, digits) => v == null ? "–" : (+v).toPrecision(digits || 3);

  function status(text, down) {
    if (!statusEl) return;
    statusEl.textContent = text;
    statusEl.classList.toggle("down", !!down);
  }

  // One chart in a figure of its own; its series are replaced when their set changes.
  function chart(id, caption, labels, styles, windowS, yLabel) {
    let c = state.charts[id];
    const key = labels.join("\u0000");
    if (c && c.key === key) return c;
    let fig = document.getElementById("fig-" + id);
    if (!fig) {
      fig = document.createElement("figure");
      fig.className = "chart";
      fig.id = "fig-" + id;
      fig.innerHTML = "<figcaption></figcaption><div class=\"plot\"></div>";
      fig.querySelector("figcaption").textContent = caption;
      chartsEl.appendChild(fig);
    }
    if (c) c.u.destroy();
    const el = fig.querySelector(".plot");
    const series = [{ label: "time (UTC)", value: (u, v) => v == null ? "–" : iso(v) }];
    labels.forEach((label, i) => series.push(Object.assign({
      label: label, stroke: colors[i % colors.length], width: 1.5,
      // Points are drawn where they are sparse enough to see (uPlot's default).
      spanGaps: false,
    }, styles ? styles(label, i) : {})));
    const opts = {
      width: Math.max(320, el.clientWidth || chartsEl.clientWidth || 800),
      height: 220,
      series: series,
      axes: [{ stroke: "#333", values: (u, vals) => vals.map(iso), space: 80 },
             { stroke: "#333", label: yLabel, size: 60 }],
      // The window ends now: the chart moves even between samples.
      scales: { x: { time: true, range: windowS ? () => [nowS() - windowS, nowS()] : undefined } },
      legend: { show: true },
    };
    const u = new uPlot(opts, [[], ...labels.map(() => [])], el);
    c = state.charts[id] = { u: u, key: key };
    return c;
  }

  // Series of [t, value] points aligned on the union of their times: a point a series lacks
  // is undefined (joined over), a lost reply is null (a gap), as uPlot draws them.
  function aligned(lists) {
    const times = [...new Set(lists.flatMap(l => l.map(p => p[0])))].sort((a, b) => a - b);
    const index = new Map(times.map((t, i) => [t, i]));
    const ys = lists.map(l => {
      const y = new Array(times.length);
      for (const [t, v] of l) y[index.get(t)] = v;
      return y;
    });
    return [times, ...ys];
  }

  function trim(points, windowS) {
    const since = nowS() - windowS;
    let n = 0;
    while (n < points.length && points[n][0] < since) n++;
    if (n) points.splice(0, n);
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  // -- PingWorld: per-second RTT by group, and the latest RTTs coloured by size -------------
  function pingPage() {
    const series = {};  // target -> [[t, rtt_ms | null]]
    const groupOf = {};
    const groups = spec.groups.map(g => ({ name: g.name, targets: g.targets.slice() }));
    groups.forEach(g => g.targets.forEach(t => { groupOf[t] = g.name; }));
    for (const [t, pts] of Object.entries(spec.series)) series[t] = pts.slice();
    const add = (target, t, v) => {
      if (!(target in groupOf)) {
        let g = groups.find(x => x.name === "(no group)");
        if (!g) groups.push(g = { name: "(no group)", targets: [] });
        g.targets.push(target);
        groupOf[target] = g.name;
      }
      (series[target] = series[target] || []).push([t, v]);
    };
    const band = v => v == null ? "rtt-lost" : v <= spec.bands_ms[0] ? "rtt-good"
      : v <= spec.bands_ms[1] ? "rtt-fair" : "rtt-poor";
    return {
      samples(rows) {
        for (const [, target, , metric, t, v] of rows) if (metric === spec.metric) add(target, t, v);
      },
      draw() {
        const body = document.querySelector("#latest tbody");
        body.textContent = "";
        groups.forEach((g, gi) => {
          g.targets.forEach(t => trim(series[t] || [], spec.window_s));
          const lists = g.targets.map(t => series[t] || []);
          chart("g" + gi, g.name, g.targets, null, spec.window_s, "RTT ms").u.setData(aligned(lists));
          g.targets.forEach(t => {
            const pts = series[t] || [];
            const last = pts.length ? pts[pts.length - 1] : null;
            const lost = pts.filter(p => p[1] == null).length;
            state.latest[t] = last ? last[1] : undefined;
            const tr = document.createElement("tr");
            tr.dataset.target = t;
            cell(tr, g.name, "group");
            cell(tr, t, "target");
            cell(tr, last ? (last[1] == null ? "lost" : fmt(last[1])) : "–", last ? band(last[1]) : "rtt-none");
            cell(tr, last ? String(Math.max(0, Math.round(nowS() - last[0]))) : "–");
            cell(tr, pts.length ? `${lost}/${pts.length}` : "–");
            body.appendChild(tr);
          });
        });
      },
    };
  }

  // -- Available bandwidth per target: raw, EWMA (w given), normalised -----------------------
  function bandwidthPage() {
    const w = spec.weight;
    const targets = {};
    for (const [t, s] of Object.entries(spec.targets)) {
      targets[t] = { t: s.t.slice(), raw: s.raw.slice(), ewma: s.ewma.slice(), norm: s.norm.slice() };
    }
    return {
      results(list) {
        for (const r of list) {
          const y = r.figures[spec.metric];
          if (r.probe !== spec.probe || !r.succeeded || y == null) continue;
          const s = targets[r.target] = targets[r.target] || { t: [], raw: [], ewma: [], norm: [] };
          if (s.t.includes(r.t_s)) continue;  // already in the first picture
          const prev = s.ewma.length ? s.ewma[s.ewma.length - 1] : null;
          s.t.push(r.t_s);
          s.raw.push(y);
          s.ewma.push(prev == null ? y : (1 - w) * prev + w * y);
          s.norm.push(r.figures[spec.normalised] == null ? null : r.figures[spec.normalised]);
        }
      },
      draw() {
        const body = document.querySelector("#latest tbody");
        body.textContent = "";
        for (const [name, s] of Object.entries(targets).sort()) {
          const labels = ["estimate", `EWMA w=${w}`];
          const withNorm = s.norm.some(v => v != null);
          if (withNorm) labels.push("normalised");
          const styles = (label, i) => i === 0 ? { width: 0, points: { show: true, size: 5, fill: colors[0] } }
            : i === 2 ? { dash: [6, 3] } : { width: 2 };
          const u = chart("t-" + name, name, labels, styles, spec.window_s, spec.metric).u;
          u.setData([s.t, s.raw, s.ewma, ...(withNorm ? [s.norm] : [])]);
          const n = s.t.length - 1;
          state.latest[name] = { raw: s.raw[n], ewma: s.ewma[n], norm: s.norm[n] };
          const tr = document.createElement("tr");
          tr.dataset.target = name;
          cell(tr, name, "target");
          cell(tr, fmt(s.raw[n]));
          cell(tr, fmt(s.ewma[n]));
          cell(tr, fmt(s.norm[n]));
          cell(tr, n >= 0 ? String(Math.round(nowS() - s.t[n])) : "–");
          body.appendChild(tr);
        }
      },
    };
  }

  // -- The monitor's interface rates (last 120 s) beside the tests running now ---------------
  function interfacePage() {
    const series = {};  // "eth0 rx_mbps" -> [[t, v]]
    for (const [iface, m] of Object.entries(spec.series)) {
      for (const metric of spec.metrics) series[`${iface} ${metric}`] = (m[metric] || []).slice();
    }
    let running = spec.running;
    let offsetS = nowS() - spec.now_s;  // the browser's clock against the server's
    const rtt = Object.assign({}, spec.rtt_ms);  // latest ping RTT per target
    return {
      samples(rows) {
        for (const [, iface, probe, metric, t, v] of rows) {
          if (probe === "ping" && metric === spec.rtt_metric) rtt[iface] = v;
          if (probe === "ping" || !spec.metrics.includes(metric)) continue;
          (series[`${iface} ${metric}`] = series[`${iface} ${metric}`] || []).push([t, v]);
        }
      },
      running(list, serverNowS) {
        running = list;
        offsetS = nowS() - serverNowS;
      },
      draw() {
        const names = Object.keys(series).sort();
        names.forEach(n => trim(series[n], spec.window_s));
        const styles = label => label.endsWith("tx_mbps") ? { dash: [6, 3] } : {};
        chart("iface", "interface rate, Mbit/s (tx dashed)", names, styles, spec.window_s, "Mbit/s")
          .u.setData(aligned(names.map(n => series[n])));
        const body = document.querySelector("#running tbody");
        body.textContent = "";
        state.running = running;
        if (!running.length) {
          const tr = document.createElement("tr");
          cell(tr, "no test running").colSpan = 7;
          body.appendChild(tr);
        }
        for (const r of running) {
          const p = r.params || {};
          const window = p.window_bytes != null ? p.window_bytes : p.window;
          const streams = p.streams != null ? p.streams : p.parallel;
          const rest = Object.entries(p).filter(([k]) => !["window_bytes", "window", "streams", "parallel"].includes(k));
          const tr = document.createElement("tr");
          tr.dataset.target = r.target;
          cell(tr, r.target);
          cell(tr, r.tool || r.probe);
          cell(tr, String(Math.max(0, Math.round(nowS() - offsetS - r.started_s))));
          cell(tr, window == null ? "–" : String(window));
          cell(tr, streams == null ? "–" : String(streams));
          cell(tr, r.target in rtt ? (rtt[r.target] == null ? "lost" : fmt(rtt[r.target])) : "–");
          cell(tr, rest.map(([k, v]) => `${k}=${v}`).join(" "));
          body.appendChild(tr);
        }
      },
    };
  }

  const page = { ping: pingPage, bandwidth: bandwidthPage, interface: interfacePage }[spec.kind]();

  // Redraws are batched: a burst of events (a reconnect's catch-up) draws once.
  let pending = false;
  function redraw() {
    if (pending) return;
    pending = true;
    window.requestAnimationFrame(() => {
      pending = false;
      page.draw();
      state.redraws++;
      const empty = document.getElementById("live-empty");
      if (empty && Object.keys(state.latest).length) empty.remove();
    });
  }
  redraw();
  // The time axis and the ages move every second even when nothing arrives.
  window.setInterval(redraw, 1000);

  const query = new URLSearchParams({ probe: spec.probe });
  if (spec.after != null) query.set("after", String(spec.after));
  if (spec.results_after != null) query.set("results_after", String(spec.results_after));
  // The browser reconnects by itself (after the server's retry delay) and sends the last
  // event id it saw, from which the server resumes.
  const source = new EventSource("/live/events?" + query.toString());
  state.source = source;
  source.onopen = () => { state.connected = true; status("live"); };
  source.onerror = () => { state.connected = false; status("reconnecting…", true); };
  const seen = () => status(`live · ${iso(nowS())} UTC`);
  source.addEventListener("samples", e => {
    const rows = JSON.parse(e.data).samples;
    state.events++;
    state.samples += rows.length;
    if (page.samples) page.samples(rows);
    seen();
    redraw();
  });
  source.addEventListener("results", e => {
    const list = JSON.parse(e.data).results;
    state.events++;
    state.results += list.length;
    if (page.results) page.results(list);
    seen();
    redraw();
  });
  source.addEventListener("running", e => {
    const d = JSON.parse(e.data);
    state.events++;
    if (page.running) page.running(d.running, d.now_s);
    redraw();
  });
  source.addEventListener("status", e => {
    const problem = JSON.parse(e.data).problem;
    if (problem) status("archive unreachable: " + problem, true);
    else seen();
  });
})();
