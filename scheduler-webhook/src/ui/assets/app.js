// gpuslice dashboard: polls api/cluster every 2 s and draws the heat map,
// the pending pods and the fragmentation trend; a click on a GPU or a node
// name asks api/nodes/{name} for the pods there. Plain DOM, no library.
"use strict";

const POLL_MS = 2000;
const state = {
  mode: "mem",        // colour by "mem" or "cores"
  view: null,         // last api/cluster answer
  shape: "",          // node names and GPU counts the DOM was built for
  cells: new Map(),   // uuid -> cell element
  selected: null,     // { node, uuid|null }
  polls: 0,
};

const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function pct(used, total) {
  return total > 0 ? used / total : 0;
}

function fmtPct(x) {
  return (100 * x).toFixed(x > 0 && x < 0.01 ? 1 : 0) + " %";
}

function fmtMiB(mib) {
  return mib >= 10240 ? (mib / 1024).toFixed(0) + " GiB" : mib + " MiB";
}

// Sequential blue scale, 0 → 1.
const STOPS = [[238, 241, 244], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
function colour(x) {
  const v = Math.max(0, Math.min(1, x)) * (STOPS.length - 1);
  const i = Math.min(Math.floor(v), STOPS.length - 2);
  const f = v - i;
  const c = STOPS[i].map((a, k) => Math.round(a + (STOPS[i + 1][k] - a) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function gpuShare(gpu) {
  return state.mode === "mem" ? pct(gpu.mem.used, gpu.mem.total) : pct(gpu.cores.used, gpu.cores.total);
}

function gpuTitle(node, gpu) {
  return `${node.name} GPU ${gpu.index} (${gpu.type})\n${gpu.uuid}\n` +
    `memory ${gpu.mem.used}/${gpu.mem.total} MiB, cores ${gpu.cores.used}/${gpu.cores.total} %, ` +
    `slices ${gpu.slots.used}/${gpu.slots.total}`;
}

// === heat map ===

function buildMap(view) {
  const map = $("heatmap");
  map.replaceChildren();
  state.cells.clear();
  const total = view.totals.gpus;
  const cell = total <= 64 ? 36 : total <= 256 ? 22 : total <= 2048 ? 12 : 7;
  document.documentElement.style.setProperty("--cell", cell + "px");
  document.body.classList.toggle("compact", total > 256);
  for (const node of view.nodes) {
    const tile = el("div", "node");
    tile.dataset.node = node.name;
    tile.title = node.name;
    const name = el("div", "node-name", node.name);
    name.dataset.node = node.name;
    tile.appendChild(name);
    const grid = el("div", "gpus");
    for (const gpu of node.gpus) {
      const c = el("div", "gpu");
      c.dataset.node = node.name;
      c.dataset.uuid = gpu.uuid;
      c.dataset.index = gpu.index;
      grid.appendChild(c);
      state.cells.set(gpu.uuid, c);
    }
    tile.appendChild(grid);
    map.appendChild(tile);
  }
}

function paintMap(view) {
  for (const node of view.nodes) {
    for (const gpu of node.gpus) {
      const c = state.cells.get(gpu.uuid);
      if (!c) continue;
      c.style.background = colour(gpuShare(gpu));
      c.title = gpuTitle(node, gpu);
      c.classList.toggle("full", gpu.slots.total > 0 && gpu.slots.used >= gpu.slots.total);
    }
  }
  markSelection();
}

function markSelection() {
  const sel = state.selected;
  for (const e of document.querySelectorAll(".selected")) e.classList.remove("selected");
  if (!sel) return;
  if (sel.uuid) {
    const c = state.cells.get(sel.uuid);
    if (c) c.classList.add("selected");
  } else {
    const tile = document.querySelector(`.node[data-node="${CSS.escape(sel.node)}"]`);
    if (tile) tile.classList.add("selected");
  }
}

// === totals, pending, fragmentation ===

function renderTotals(view) {
  const t = view.totals;
  $("node-count").textContent = t.nodes;
  $("gpu-count").textContent = t.gpus;
  $("mem-total").textContent = `${fmtPct(pct(t.mem.used, t.mem.total))} of ${fmtMiB(t.mem.total)}`;
  $("cores-total").textContent = fmtPct(pct(t.cores.used, t.cores.total));
  $("slots-total").textContent = `${t.slots.used}/${t.slots.total}`;
  $("pod-count").textContent = t.pods;
  $("pending-count").textContent = t.pending;
}

function renderPending(view) {
  const body = $("pending").tBodies[0];
  body.replaceChildren();
  for (const p of view.pending) {
    const row = el("tr", "pending-pod");
    row.appendChild(el("td", "", `${p.namespace}/${p.name}`));
    row.appendChild(el("td", "", p.summary));
    body.appendChild(row);
  }
  $("no-pending").hidden = view.pending.length > 0;
}

function renderFragmentation(view) {
  const f = view.fragmentation;
  $("frag-ratio").textContent = f.sampled_at === null ? "–" : fmtPct(f.ratio);
  $("frag-milli").textContent = (f.milli / 1000).toFixed(2);
  $("frag-idle").textContent = (f.idle_milli / 1000).toFixed(2);
  const canvas = $("trend");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 4;
  ctx.clearRect(0, 0, w, h);
  const pts = view.trend;
  if (pts.length === 0) return;
  const t0 = pts[0].t, t1 = Math.max(pts[pts.length - 1].t, t0 + 1);
  const top = Math.max(0.05, ...pts.map((p) => p.ratio));
  ctx.strokeStyle = "#2171b5";
  ctx.lineWidth = 2;
  ctx.beginPath();
  pts.forEach((p, i) => {
    const x = pad + ((p.t - t0) / (t1 - t0)) * (w - 2 * pad);
    const y = h - pad - (p.ratio / top) * (h - 2 * pad);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#656d76";
  ctx.font = "10px sans-serif";
  ctx.fillText(fmtPct(top), pad, 10);
  ctx.fillText(`${Math.round(t1 - t0)} s`, w - 40, h - 6);
}

// === detail: the pods on a node or a GPU ===

async function showDetail() {
  const sel = state.selected;
  const box = $("detail");
  if (!sel) { box.hidden = true; return; }
  let node;
  try {
    const r = await fetch(`api/nodes/${encodeURIComponent(sel.node)}`);
    if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
    node = await r.json();
  } catch (e) {
    $("detail-title").textContent = sel.node;
    $("detail-sub").textContent = `cannot read the node: ${e.message}`;
    box.hidden = false;
    return;
  }
  if (state.selected !== sel) return; // a newer click won
  const gpuIndex = new Map(node.gpus.map((g) => [g.uuid, g]));
  let pods = node.pods;
  if (sel.uuid) {
    const gpu = gpuIndex.get(sel.uuid);
    $("detail-title").textContent = `${node.name} · GPU ${gpu ? gpu.index : "?"}`;
    $("detail-sub").textContent = gpu
      ? `${gpu.type} · ${gpu.uuid} · memory ${gpu.mem.used}/${gpu.mem.total} MiB · cores ${gpu.cores.used}/${gpu.cores.total} % · slices ${gpu.slots.used}/${gpu.slots.total}`
      : sel.uuid;
    pods = pods
      .map((p) => ({ ...p, slices: p.slices.filter((s) => s.uuid === sel.uuid) }))
      .filter((p) => p.slices.length > 0);
  } else {
    const used = node.gpus.reduce((a, g) => a + g.mem.used, 0);
    const total = node.gpus.reduce((a, g) => a + g.mem.total, 0);
    $("detail-title").textContent = node.name;
    $("detail-sub").textContent =
      `${node.gpus.length} GPUs · memory ${used}/${total} MiB · fragmentation ${(node.fragmentation_milli / 1000).toFixed(2)} GPUs`;
  }
  const body = $("pods").tBodies[0];
  body.replaceChildren();
  for (const p of pods) {
    const row = el("tr", "pod");
    row.dataset.pod = `${p.namespace}/${p.name}`;
    row.appendChild(el("td", "pod-name", `${p.namespace}/${p.name}`));
    const slices = p.slices.map((s) => {
      const g = gpuIndex.get(s.uuid);
      return `GPU ${g ? g.index : "?"} c${s.container}: ${s.mem} MiB, ${s.cores} %`;
    });
    row.appendChild(el("td", "slices", slices.join("\n")));
    row.lastChild.style.whiteSpace = "pre";
    body.appendChild(row);
  }
  $("no-pods").hidden = pods.length > 0;
  box.hidden = false;
}

$("heatmap").addEventListener("click", (ev) => {
  const target = ev.target.closest(".gpu, .node-name");
  if (!target) return;
  state.selected = { node: target.dataset.node, uuid: target.dataset.uuid || null };
  markSelection();
  showDetail();
});

for (const radio of document.querySelectorAll('input[name="mode"]')) {
  radio.addEventListener("change", () => {
    state.mode = radio.value;
    if (state.view) paintMap(state.view);
  });
}

// === polling ===

// api/cluster sends each GPU as an array of view.gpu_fields (compact at
// thousands of GPUs); the rest of this file reads objects.
function decode(view) {
  const at = Object.fromEntries(view.gpu_fields.map((f, i) => [f, i]));
  for (const node of view.nodes) {
    node.gpus = node.gpus.map((r) => ({
      uuid: r[at.uuid],
      index: r[at.index],
      type: view.types[r[at.type]],
      mem: { used: r[at.mem_used], total: r[at.mem_total] },
      cores: { used: r[at.cores_used], total: r[at.cores_total] },
      slots: { used: r[at.slots_used], total: r[at.slots_total] },
    }));
  }
  return view;
}

async function poll() {
  try {
    const r = await fetch("api/cluster");
    if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
    const view = decode(await r.json());
    state.view = view;
    const shape = view.nodes.map((n) => `${n.name}:${n.gpus.map((g) => g.uuid).join(",")}`).join(";");
    if (shape !== state.shape) {
      buildMap(view);
      state.shape = shape;
    }
    paintMap(view);
    renderTotals(view);
    renderPending(view);
    renderFragmentation(view);
    if (state.selected) showDetail();
    state.polls += 1;
    document.body.dataset.polls = state.polls;
    const status = $("status");
    status.classList.remove("error");
    status.textContent = (view.ready ? "live" : "caches syncing") + ` · ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    const status = $("status");
    status.classList.add("error");
    status.textContent = `cannot reach the scheduler: ${e.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
