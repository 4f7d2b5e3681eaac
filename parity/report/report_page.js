// report.html's script (parity/report/html.py inlines it). Every predicted number is read from the
// data parity/report/html_model.py exports from the Python model; `predict` only adds up its terms.
"use strict";
const D = JSON.parse(document.getElementById("report-data").textContent);
const M = D.model;
const MIB = 1048576;
const MEASURED = {symbol: "circle", size: 11, color: "#b33"};
const PLOT_CONFIG = {displaylogo: false, responsive: true};

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}
function fmtBytes(v) {
  return v === null || v === undefined ? "-" : `${v.toLocaleString("en-US")} B (${(v / MIB).toFixed(3)} MiB)`;
}
function mib(v) { return v === null || v === undefined || typeof v !== "number" ? null : v / MIB; }
function fmtInt(v) { return v === null || v === undefined ? "-" : v.toLocaleString("en-US"); }

// Run-length coded segments [length, checkpointed, inner, count] -> a list of segments.
function expand(rle) {
  const out = [];
  for (const [length, ckpt, inner, count] of rle)
    for (let i = 0; i < count; i++) out.push({length, ckpt: ckpt === 1, inner: inner === null ? null : expand(inner)});
  return out;
}
// jaxremat.models.gpt.activation._chain_peak over exported segments and byte terms.
function chainPeak(segs, unit, bnd, inv) {
  let keptBelow = 0, peak = 0;
  segs.forEach((s, j) => {
    const segPeak = s.inner === null ? s.length * unit + (s.ckpt ? bnd : 0) : chainPeak(s.inner, unit, bnd, inv);
    peak = Math.max(peak, j * bnd + keptBelow + segPeak + inv);
    keptBelow += s.ckpt ? 0 : s.length * unit;
  });
  return peak;
}
function scheduleText(kind, param) {
  return {every_k: `every_k(${param})`, segments: `segments(${param})`, nested: "nested(sqrt,sqrt)"}[kind] || kind;
}
// predict_saved_bytes / predict_peak_activation_bytes / peak_units / recomputed_blocks for one setting.
function predict(s) {
  const acc = M.accounts[`${s.framework}|${s.batch}|${s.seq}`];
  const ent = (M.schedules[s.n_layer] || {})[scheduleText(s.kind, s.param)];
  if (!acc || !ent) return null;
  const out = {name: ent.name, peak_units: ent.units[s.policy], recomputed_blocks: ent.recomputed[s.policy],
               saved_bytes: null, peak_activation_bytes: null};
  out.recompute_flops = out.recomputed_blocks * acc.block_flops;
  if (!M.modelled_policies.includes(s.policy)) return out;
  const segs = expand(ent.segs);
  let stack = 0;
  for (const g of segs) stack += g.ckpt ? acc.boundary : g.length * acc.unit;
  if (segs.some(g => !g.ckpt)) stack += acc.invariant;
  out.saved_bytes = acc.outside + stack;
  const chain = chainPeak(segs, acc.unit, acc.boundary, acc.chain_invariant);
  out.peak_activation_bytes = acc.non_stack + Math.max(chain, stack);
  return out;
}
window.jaxrematModel = {predict, scheduleText};

// the measured points of one control setting: the same value of every key in keys
function sameAt(p, s, keys) { return keys.every(k => p[k] === s[k]); }
function measuredFor(s, name) {
  return D.points.filter(p => sameAt(p, s, ["framework", "n_layer", "policy", "batch", "seq"]) && p.schedule === name &&
                         (!M || p.dtype === M.config.dtype));
}

// ---------- the live part ----------
const state = {};
function select(id, label, options, value) {
  const s = el("select", {id});
  for (const o of options) s.append(el("option", {value: String(o)}, String(o)));
  s.value = String(value);
  return el("label", {}, label, s);
}
function buildLive() {
  const live = document.getElementById("live");
  if (!M) {
    live.append(el("p", {class: "note", id: "no-model"}, "The per-layer model covers the GPT family without dropout; " +
      "this report's model is not covered, so the page shows the measured views only."));
    return;
  }
  const d = D.defaults;
  const n0 = Math.min(d.n_layer || 8, M.max_depth);
  const controls = el("div", {id: "controls"},
    el("label", {}, el("span", {}, "depth N (blocks): ", el("output", {id: "n-out"}, String(n0))),
       el("input", {id: "n", type: "range", min: "1", max: String(M.max_depth), value: String(n0)})),
    select("kind", "schedule", M.kinds, "sqrt"),
    el("label", {}, el("span", {}, "k (every_k) or s (segments): ", el("output", {id: "param-out"}, "2")),
       el("input", {id: "param", type: "range", min: "1", max: String(n0), value: "2"})),
    select("policy", "policy (the per-layer model covers " + M.modelled_policies.join(", ") + ")", M.policies, "save_nothing"),
    select("batch", "batch B (sequences)", M.batches, M.batches.includes(d.batch) ? d.batch : M.batches[0]),
    select("seq", "sequence length T (tokens)", M.seqs, M.seqs.includes(d.seq) ? d.seq : M.seqs[0]),
    select("framework", "framework", M.frameworks, M.frameworks[0]));
  live.append(controls);
  live.append(el("p", {class: "note"}, `Widths: d_model ${M.config.d_model}, ${M.config.n_head} heads, d_ff ` +
    `${M.config.d_ff}, vocab ${M.config.vocab_size}, ${M.config.dtype}.`));
  const rows = [["schedule", "sched-name"], ["predicted saved bytes (per-layer model)", "pred-saved"],
                ["predicted peak activation bytes (per-layer model)", "pred-peak"],
                ["peak units (unit model; none: N + 1)", "units"], ["recomputed blocks per step", "recomputed"],
                ["recompute FLOPs per step (matmuls)", "flops"], ["measured saved bytes", "meas-saved"],
                ["measured peak activation bytes", "meas-peak"]];
  const tbl = el("table", {id: "numbers"});
  for (const [what, id] of rows)
    tbl.append(el("tr", {}, el("td", {class: "what" + (id.startsWith("meas") ? " measured" : "")}, what), el("td", {id})));
  live.append(tbl);
  live.append(el("div", {class: "row"}, el("div", {id: "live-segments", class: "plot"}),
                 el("div", {id: "live-depth", class: "plot"})));
  for (const id of ["n", "kind", "param", "policy", "batch", "seq", "framework"])
    document.getElementById(id).addEventListener("input", update);
  update();
}
function readState() {
  const v = id => document.getElementById(id).value;
  const param = document.getElementById("param");
  const n = +v("n");
  param.max = String(n);
  if (+param.value > n) param.value = String(n);
  param.disabled = !["every_k", "segments"].includes(v("kind"));
  return {n_layer: n, kind: v("kind"), param: +param.value, policy: v("policy"), batch: +v("batch"), seq: +v("seq"),
          framework: v("framework")};
}
function setCell(id, text, value) {
  const c = document.getElementById(id);
  c.textContent = text;
  c.dataset.value = value === null || value === undefined ? "" : String(value);
}
function update() {
  const s = readState();
  Object.assign(state, s);
  document.getElementById("n-out").textContent = String(s.n_layer);
  document.getElementById("param-out").textContent = String(s.param);
  const p = predict(s);
  const meas = p ? measuredFor(s, p.name) : [];
  setCell("sched-name", p ? p.name + (s.policy !== "save_nothing" ? "+" + s.policy : "") : "not valid at this depth", p ? p.name : null);
  const nm = M.modelled_policies.includes(s.policy) ? null : "not modelled for this policy (the account lists a block without remat)";
  setCell("pred-saved", p ? (nm || fmtBytes(p.saved_bytes)) : "-", p && p.saved_bytes);
  setCell("pred-peak", p ? (nm || fmtBytes(p.peak_activation_bytes)) : "-", p && p.peak_activation_bytes);
  setCell("units", p ? fmtInt(p.peak_units) : "-", p && p.peak_units);
  setCell("recomputed", p ? fmtInt(p.recomputed_blocks) : "-", p && p.recomputed_blocks);
  setCell("flops", p ? `${fmtInt(p.recompute_flops)} (${(p.recompute_flops / 1e9).toFixed(3)} GFLOP)` : "-", p && p.recompute_flops);
  const mtext = key => meas.length ? meas.map(m => `${fmtBytes(m[key])} measured (${m.mode})`).join("; ") :
    "no measurement in this report for this setting";
  setCell("meas-saved", mtext("saved_bytes"), meas.length ? meas[0].saved_bytes : null);
  setCell("meas-peak", mtext("peak_activation_bytes"), meas.length ? meas[0].peak_activation_bytes : null);
  drawLiveSegments(s, p);
  drawLiveDepth(s);
}
function drawLiveSegments(s, current) {
  const xs = [], units = [], ref = [], bytes = [];
  for (let k = 1; k <= s.n_layer; k++) {
    const q = predict({...s, kind: "segments", param: k});
    if (!q) continue;
    xs.push(k); units.push(q.peak_units); ref.push(k + s.n_layer / k);
    bytes.push(q.peak_activation_bytes === null ? null : mib(q.peak_activation_bytes));
  }
  const traces = [
    {x: xs, y: bytes, name: "segments(s): predicted peak activation (per-layer model)", mode: "lines+markers", yaxis: "y"},
    {x: xs, y: units, name: "segments(s): peak units (unit model), predicted", mode: "lines+markers", yaxis: "y2",
     line: {dash: "dot"}},
    {x: xs, y: ref, name: "s + N/s (reference)", mode: "lines", yaxis: "y2", line: {dash: "dash", color: "#999"}}];
  const meas = [];
  for (const k of xs) {
    const q = predict({...s, kind: "segments", param: k});
    for (const m of measuredFor(s, q.name)) meas.push([k, mib(m.peak_activation_bytes), m.mode]);
  }
  if (meas.length)
    traces.push({x: meas.map(m => m[0]), y: meas.map(m => m[1]), text: meas.map(m => "measured " + m[2]),
                 name: "measured peak activation", mode: "markers", marker: MEASURED, yaxis: "y"});
  Plotly.react("live-segments", traces, {
    title: {text: `Peak vs segment count at N = ${s.n_layer} (${s.framework}, B = ${s.batch}, T = ${s.seq})`},
    xaxis: {title: {text: "segments s"}},
    yaxis2: {title: {text: "peak units (blocks' activations)"}, overlaying: "y", side: "right", rangemode: "tozero"},
    yaxis: {title: {text: "peak activation (MiB)"}, rangemode: "tozero"},
    legend: {orientation: "h", y: -0.25}, margin: {t: 50}}, PLOT_CONFIG);
}
function drawLiveDepth(s) {
  const xs = [], saved = [], peak = [];
  for (let n = 1; n <= M.max_depth; n++) {
    const q = predict({...s, n_layer: n});
    if (!q || q.saved_bytes === null) continue;
    xs.push(n); saved.push(mib(q.saved_bytes)); peak.push(mib(q.peak_activation_bytes));
  }
  const name = scheduleText(s.kind, s.param);
  const traces = [{x: xs, y: saved, name: `${name}: saved, predicted`, mode: "lines"},
                  {x: xs, y: peak, name: `${name}: peak activation, predicted`, mode: "lines"}];
  const meas = D.points.filter(p => sameAt(p, s, ["framework", "batch", "seq", "policy"]) &&
    (M.schedules[p.n_layer] || {})[name] && p.schedule === M.schedules[p.n_layer][name].name);
  if (meas.length) {
    traces.push({x: meas.map(m => m.n_layer), y: meas.map(m => mib(m.saved_bytes)), name: "saved, measured",
                 mode: "markers", marker: {...MEASURED, symbol: "square"}, text: meas.map(m => m.mode)});
    traces.push({x: meas.map(m => m.n_layer), y: meas.map(m => mib(m.peak_activation_bytes)),
                 name: "peak activation, measured", mode: "markers", marker: MEASURED, text: meas.map(m => m.mode)});
  }
  Plotly.react("live-depth", traces, {
    title: {text: `Memory vs depth under ${name}${s.policy !== "save_nothing" ? "+" + s.policy : ""}`},
    xaxis: {title: {text: "depth N (blocks)"}}, yaxis: {title: {text: "bytes (MiB)"}},
    shapes: [{type: "line", x0: s.n_layer, x1: s.n_layer, yref: "paper", y0: 0, y1: 1, line: {dash: "dot", color: "#888"}}],
    legend: {orientation: "h", y: -0.25}, margin: {t: 50}}, PLOT_CONFIG);
}

// ---------- static views ----------
function section(title, note) {
  const div = el("div", {class: "plot", id: "static-" + (document.querySelectorAll("#static .plot").length + 1)});
  document.getElementById("static").append(el("h3", {}, title), el("p", {class: "note"}, note), div);
  return div;
}
function buildStatic() {
  const pts = D.points;
  if (pts.length || D.curves.length) {
    const div = section("Peak activation vs depth, per schedule, both frameworks",
      "Lines: the per-layer model's prediction at the report's batch and sequence length (predicted). Markers: measured.");
    const traces = D.curves.map(c => ({x: c.depths, y: c.peak_activation_bytes.map(v => mib(v)), mode: "lines",
      name: `${c.framework} ${c.schedule} (predicted)`, line: {dash: D.line_dash[c.framework] || "dash"}}));
    const groups = {};
    for (const p of pts) (groups[`${p.framework} ${p.mode} ${p.label}`] ||= []).push(p);
    for (const [k, g] of Object.entries(groups))
      traces.push({x: g.map(p => p.n_layer), y: g.map(p => mib(p.peak_activation_bytes)), mode: "markers",
                   name: `${k} (measured)`, marker: {size: 9}});
    Plotly.newPlot(div, traces, {height: 560, xaxis: {title: {text: "depth N (blocks), log scale"}, type: "log"},
      yaxis: {title: {text: "peak activation (MiB), log scale"}, type: "log"}, legend: {font: {size: 10}}}, PLOT_CONFIG);
    const div2 = section("Saved vs peak activation, per plan",
      "Filled markers: measured. Open markers: the per-layer model's prediction (where it covers the plan).");
    const meas = {x: pts.map(p => mib(p.saved_bytes)), y: pts.map(p => mib(p.peak_activation_bytes)),
      text: pts.map(p => `${p.framework} ${p.mode} N=${p.n_layer} ${p.label}`), mode: "markers", name: "measured",
      marker: MEASURED};
    const pp = pts.filter(p => p.predicted_saved_bytes !== null && p.predicted_peak_activation_bytes !== null);
    const pred = {x: pp.map(p => mib(p.predicted_saved_bytes)), y: pp.map(p => mib(p.predicted_peak_activation_bytes)),
      text: pp.map(p => `${p.framework} N=${p.n_layer} ${p.label}`), mode: "markers", name: "predicted",
      marker: {symbol: "circle-open", size: 11, color: "#36c"}};
    Plotly.newPlot(div2, [meas, pred], {xaxis: {title: {text: "saved bytes (MiB)"}},
      yaxis: {title: {text: "peak activation (MiB)"}}}, PLOT_CONFIG);
    const tp = pts.filter(p => p.time_overhead !== null && p.peak_activation_ratio !== null && p.time_overhead !== undefined);
    if (tp.length) {
      const div3 = section("The trade: step time vs memory",
        "Measured: median step time over none's, against peak activation over none's (same framework and mode).");
      Plotly.newPlot(div3, [{x: tp.map(p => p.peak_activation_ratio), y: tp.map(p => p.time_overhead),
        text: tp.map(p => `${p.framework} ${p.mode} N=${p.n_layer} ${p.label}`), mode: "markers", name: "measured",
        marker: MEASURED}], {xaxis: {title: {text: "peak activation / none's (ratio)"}},
        yaxis: {title: {text: "step time / none's (ratio)"}}}, PLOT_CONFIG);
    }
  }
  if (D.plan_rows.length || D.compiled.length) {
    const div4 = section("Frontier: recompute vs measured peak activation",
      "Measured peak activation of each budget's plan; recompute FLOPs as the report gives them.");
    const tr = ["planner", "uniform"].map(w => {
      const r = D.plan_rows.filter(p => p.who === w);
      return {x: r.map(p => mib(p.peak_activation_bytes)), y: r.map(p => (p.recompute_flops || 0) / 1e9),
              text: r.map(p => `${p.framework} ${p.budget} ${p.plan}`), mode: "markers", name: `${w} (measured)`};
    });
    if (D.compiled.length)
      tr.push({x: D.compiled.map(p => mib(p.peak_activation_bytes)), y: D.compiled.map(p => (p.recompute_flops || 0) / 1e9),
               text: D.compiled.map(p => `torch.compile budget ${p.budget}`), mode: "markers",
               name: "torch.compile activation_memory_budget (measured)"});
    Plotly.newPlot(div4, tr, {xaxis: {title: {text: "peak activation (MiB), measured"}},
      yaxis: {title: {text: "recompute (GFLOP per step)"}}}, PLOT_CONFIG);
  }
  if (D.loss_curves && D.loss_curves.length) {
    const div5 = section("Fine-tuning: loss per step, per plan and framework",
      "Every plan's curve lies on none's when remat changed no bit (the case table says whether it did).");
    Plotly.newPlot(div5, D.loss_curves.map(c => ({x: c.losses.map((_, i) => i + 1), y: c.losses, mode: "lines+markers",
      name: `${c.framework} ${c.plan} dropout ${c.dropout}`, line: {dash: c.dropout === 0 ? "dot" : (D.line_dash[c.framework] || "dash")}})),
      {xaxis: {title: {text: "step"}}, yaxis: {title: {text: "loss"}}, legend: {font: {size: 10}}}, PLOT_CONFIG);
  }
  if (D.estimate_rows && D.estimate_rows.length) {
    const div6 = section("Estimated memory of one training step, per plan and framework (nothing allocated)",
      "Stacked: parameters, gradients, AdamW state and the activation peak (the step's peak less the model state); the bar's top is the total peak.");
    const GIB = 1024 * 1024 * 1024, R = D.estimate_rows, labels = R.map(r => `${r.framework} ${r.plan}`);
    const parts = [["parameters", "parameters_bytes"], ["gradients", "gradients_bytes"], ["AdamW state", "adamw_state_bytes"],
                   ["activation peak", "activation_peak_bytes"]];
    Plotly.newPlot(div6, parts.map(([name, key]) => ({type: "bar", name: name, x: labels, y: R.map(r => (r[key] || 0) / GIB)})),
      {barmode: "stack", height: 520, yaxis: {title: {text: "GiB (2^30 bytes)"}}, xaxis: {automargin: true},
       legend: {orientation: "h", y: 1.08}}, PLOT_CONFIG);
  }
  if (D.cross_framework.length) {
    const host = document.getElementById("static");
    host.append(el("h3", {}, "JAX vs PyTorch (same weights and tokens), measured"));
    const t = el("table", {class: "data", id: "cross-table"});
    t.append(el("tr", {}, ...["dtype", "schedule", "loss err", "loss tol", "grads err", "grads tol", "ok"].map(h => el("th", {}, h))));
    const f = v => v === null || v === undefined ? "-" : Number(v).toExponential(2);
    for (const r of D.cross_framework)
      t.append(el("tr", {}, el("td", {}, r[0]), el("td", {class: "what"}, r[1]), el("td", {}, f(r[2])), el("td", {}, f(r[3])),
                  el("td", {}, f(r[4])), el("td", {}, f(r[5])), el("td", {}, r[6] ? "yes" : "NO")));
    host.append(t);
  }
}
buildLive();
buildStatic();
document.body.dataset.ready = "1";
