/* vramlens HTML report (Apache-2.0): draws the page's data block with uPlot.
 * Every string reaches the page through textContent or canvas text, never as markup:
 * names in a report (modules, frames, files, models) come from untrusted files. */
(function () {
  "use strict";
  const state = { drawn: false, drawnAt: null, draws: 0, plot: null, hidden: [] };
  window.vramlens = state;
  const D = JSON.parse(document.getElementById("vramlens-data").textContent);
  state.data = D;
  const chartEl = document.getElementById("vl-chart");
  const tip = document.getElementById("vl-tooltip");
  const legendEl = document.getElementById("vl-legend");
  const cats = D.categories; // [name, label, color], bottom of the stack first
  const n = D.x.length;
  const phaseUnit = D.unit === "phase";
  const hidden = cats.map(() => false);
  state.hidden = hidden;
  const HEIGHT = 420;

  if (!n || !cats.length) {
    const p = document.createElement("p");
    p.textContent = "No memory to draw.";
    chartEl.appendChild(p);
    state.drawn = true;
    state.drawnAt = performance.now();
    return;
  }

  // Steps hold each value until the next point: one extra point closes the last step (an
  // estimate's phases become plateaus [i, i+1); a timeline's last event gets 1% of the span).
  const span = D.x[n - 1] - D.x[0];
  const end = phaseUnit ? n : D.x[n - 1] + Math.max(span * 0.01, D.unit === "ms" ? 0.001 : 1);
  const xs = D.x.concat([end]);
  const last = xs.length - 1;
  const peakIdx = D.peak[0];
  const peakX = (xs[peakIdx] + xs[peakIdx + 1]) / 2; // the middle of the peak's step
  const capShown = D.capacity != null && D.peak[1] > 0 && D.capacity <= 3 * D.peak[1];

  const UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  function fmtBytes(b, digits) {
    const m = Math.abs(b);
    for (const [name, scale] of UNITS) {
      if (m >= scale) return (b / scale).toFixed(digits == null ? 2 : digits) + " " + name;
    }
    return b + " B";
  }
  function fmtX(i) {
    if (D.unit === "ms") return D.x[i].toFixed(3) + " ms";
    if (D.unit === "event") return "event " + D.x[i].toLocaleString("en-US");
    return "phase " + D.phases[i][0];
  }

  // Stacked bands: cumulative sums bottom-up (hidden categories add nothing), drawn top-first
  // with opaque fills so each lower band paints over the one above it.
  function stacked() {
    const acc = new Float64Array(xs.length);
    const rows = [];
    for (let c = 0; c < cats.length; c++) {
      const row = D.values[c];
      const out = new Array(xs.length);
      for (let i = 0; i < n; i++) {
        if (!hidden[c]) acc[i] += row[i];
        out[i] = acc[i];
      }
      out[n] = out[n - 1];
      rows.push(out);
    }
    return [xs].concat(rows.reverse());
  }
  const seriesOf = (c) => cats.length - c; // uPlot series index of category c

  function floorIdx(x) {
    let lo = 0, hi = last;
    if (x <= xs[0]) return 0;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (xs[mid] <= x) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  // The point under the cursor: of the points drawn in its pixel, the one with the highest
  // visible total (so hovering a spike shows the spike, as the min/max level of detail drew it).
  let pickCache = [NaN, 0];
  function pick(u, x) {
    if (x === pickCache[0]) return pickCache[1];
    const left = u.valToPos(x, "x");
    let i = floorIdx(u.posToVal(left, "x"));
    const stop = Math.min(n - 1, floorIdx(u.posToVal(left + 0.999, "x")));
    let best = Math.min(i, n - 1);
    for (; i <= stop; i++) if (visibleTop(i) > visibleTop(best)) best = i;
    pickCache = [x, best];
    return best;
  }

  function visibleTop(i) {
    let top = 0;
    for (let c = 0; c < cats.length; c++) if (!hidden[c]) top += D.values[c][i];
    return top;
  }

  function drawPhaseBands(u) {
    const ctx = u.ctx, { left, top, width, height } = u.bbox;
    ctx.save();
    for (let k = 0; k < D.phases.length; k++) {
      const [x0, x1] = phaseSpan(k);
      const p0 = Math.max(left, u.valToPos(x0, "x", true)), p1 = Math.min(left + width, u.valToPos(x1, "x", true));
      if (p1 <= p0 || k % 2 === 0) continue;
      ctx.fillStyle = "rgba(0, 0, 0, 0.05)";
      ctx.fillRect(p0, top, p1 - p0, height);
    }
    ctx.restore();
  }
  function phaseSpan(k) {
    const ph = D.phases[k];
    if (phaseUnit) return [ph[1], ph[2] + 1];
    return [ph[1], k + 1 < D.phases.length ? D.phases[k + 1][1] : xs[last]];
  }

  function drawPhaseLabels(u) {
    const ctx = u.ctx, { left, top, width } = u.bbox, px = devicePixelRatio || 1;
    if (phaseUnit) return; // the x axis names them
    ctx.save();
    ctx.font = Math.round(11 * px) + "px system-ui, sans-serif";
    ctx.textBaseline = "top";
    for (let k = 0; k < D.phases.length; k++) {
      const [x0, x1] = phaseSpan(k);
      const p0 = Math.max(left, u.valToPos(x0, "x", true)), p1 = Math.min(left + width, u.valToPos(x1, "x", true));
      if (p1 - p0 < 30 * px) continue;
      ctx.strokeStyle = "rgba(0, 0, 0, 0.25)";
      ctx.beginPath(); ctx.moveTo(Math.round(p0) + 0.5, top); ctx.lineTo(Math.round(p0) + 0.5, top + 14 * px); ctx.stroke();
      let name = String(D.phases[k][0]);
      while (name.length > 1 && ctx.measureText(name).width > p1 - p0 - 8 * px) name = name.slice(0, -2) + "\u2026";
      ctx.fillStyle = "#444";
      ctx.fillText(name, p0 + 4 * px, top + 2 * px);
    }
    ctx.restore();
  }

  function drawCapacityAndPeak(u) {
    const ctx = u.ctx, { left, top, width, height } = u.bbox, px = devicePixelRatio || 1;
    ctx.save();
    ctx.font = Math.round(11 * px) + "px system-ui, sans-serif";
    if (D.capacity != null) {
      ctx.fillStyle = "#b00020";
      if (capShown) {
        const y = Math.round(u.valToPos(D.capacity, "y", true)) + 0.5;
        ctx.strokeStyle = "#b00020"; ctx.lineWidth = 1.5 * px; ctx.setLineDash([6 * px, 4 * px]);
        ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + width, y); ctx.stroke();
        ctx.textAlign = "right"; ctx.textBaseline = "bottom";
        ctx.fillText("capacity " + fmtBytes(D.capacity), left + width - 4 * px, y - 3 * px);
      } else {
        ctx.textAlign = "right"; ctx.textBaseline = "top";
        ctx.fillText("capacity " + fmtBytes(D.capacity) + " (above the scale)", left + width - 4 * px, top + 18 * px);
      }
    }
    const x = u.valToPos(peakX, "x", true), y = u.valToPos(visibleTop(peakIdx), "y", true);
    if (x >= left && x <= left + width) {
      ctx.setLineDash([]); ctx.fillStyle = "#111";
      ctx.beginPath(); ctx.moveTo(x, y - 2 * px); ctx.lineTo(x - 6 * px, y - 12 * px); ctx.lineTo(x + 6 * px, y - 12 * px);
      ctx.closePath(); ctx.fill();
      ctx.textAlign = x > left + width / 2 ? "right" : "left"; ctx.textBaseline = "bottom";
      const label = "peak " + fmtBytes(D.peak[1]);
      ctx.fillText(label, x + (ctx.textAlign === "right" ? -8 : 8) * px, Math.max(top + 28 * px, y - 12 * px));
    }
    ctx.restore();
    state.draws += 1;
    if (!state.drawn) {
      state.drawn = true;
      state.drawnAt = performance.now();
    }
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = String(text);
    return node;
  }
  function row(color, label, value) {
    const r = el("div", "vl-row");
    const name = el("span");
    if (color) { const sw = el("span", "vl-swatch"); sw.style.background = color; name.appendChild(sw); }
    name.appendChild(document.createTextNode(" " + label));
    r.appendChild(name);
    r.appendChild(el("span", null, value));
    return r;
  }

  function eventBlock(i) {
    const P = D.points, box = el("div", "vl-event");
    const nb = P.nbytes[i], c = P.category[i];
    const what = (nb >= 0 ? "allocation of " : "free of ") + fmtBytes(Math.abs(nb));
    box.appendChild(el("div", "vl-head", what + (c >= 0 ? " (" + cats[c][1] + ")" : "") + ", event #" + P.event[i]));
    const name = (code, table) => (code >= 0 ? table[code] : "(none)");
    box.appendChild(row(null, "phase", name(P.phase[i], P.phases)));
    box.appendChild(row(null, "module", name(P.module[i], P.modules)));
    const stack = P.stack[i] >= 0 ? P.stacks[P.stack[i]].map((f) => P.frames[f]).join("\n") : "(no stack recorded)";
    box.appendChild(el("pre", "vl-stack", stack));
    return box;
  }

  function showTip(u) {
    if (u.cursor.idx == null || u.cursor.left == null || u.cursor.left < 0) { tip.hidden = true; return; }
    const i = pick(u, u.posToVal(u.cursor.left, "x"));
    tip.replaceChildren();
    tip.appendChild(el("div", "vl-head", fmtX(i)));
    tip.appendChild(row(null, "total", fmtBytes(D.total[i])));
    for (let c = cats.length - 1; c >= 0; c--) {
      const v = D.values[c][i];
      if (v) tip.appendChild(row(cats[c][2], cats[c][1] + (hidden[c] ? " (hidden)" : ""), fmtBytes(v)));
    }
    if (D.points) tip.appendChild(eventBlock(i));
    else if (D.notes[i]) tip.appendChild(el("div", "vl-event", D.notes[i]));
    tip.hidden = false;
    const over = u.over.getBoundingClientRect(), box = chartEl.getBoundingClientRect();
    let left = over.left - box.left + u.cursor.left + 16;
    if (left + tip.offsetWidth > box.width) left = Math.max(0, left - tip.offsetWidth - 32);
    let top = over.top - box.top + u.cursor.top + 16;
    if (top + tip.offsetHeight > over.bottom - box.top) top = Math.max(0, top - tip.offsetHeight - 32);
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  }

  function setX(u, min, max) {
    const lo = xs[0], hi = xs[last], w = max - min;
    if (!(w > 0) || w >= hi - lo) { min = lo; max = hi; } else {
      if (min < lo) { min = lo; max = lo + w; }
      if (max > hi) { max = hi; min = hi - w; }
    }
    u.setScale("x", { min, max });
  }

  function panOnShiftDrag(u, targ, handler) {
    return (e) => {
      if (!e.shiftKey) return handler(e);
      const x0 = e.clientX, min = u.scales.x.min, max = u.scales.x.max;
      const move = (m) => setX(u, min - (m.clientX - x0) / u.over.clientWidth * (max - min), max - (m.clientX - x0) / u.over.clientWidth * (max - min));
      const up = () => { document.removeEventListener("mousemove", move); document.removeEventListener("mouseup", up); };
      document.addEventListener("mousemove", move);
      document.addEventListener("mouseup", up);
      return null;
    };
  }

  const axisFont = "12px system-ui, sans-serif";
  const xAxis = { label: chartEl.dataset.axis, font: axisFont, labelFont: axisFont };
  if (phaseUnit) {
    xAxis.splits = (u, ai, lo, hi) => D.phases.map((p, k) => k + 0.5).filter((v) => v >= lo && v <= hi);
    xAxis.values = (u, splits) => splits.map((v) => String(D.phases[Math.floor(v)][0]));
  }
  const opts = {
    width: Math.max(320, chartEl.clientWidth),
    height: HEIGHT,
    legend: { show: false },
    scales: {
      x: { time: false },
      y: { range: (u, min, max) => { const t = capShown ? Math.max(max, D.capacity) : max; return [0, t > 0 ? t * 1.08 : 1]; } },
    },
    axes: [xAxis, { font: axisFont, size: 84, values: (u, splits) => splits.map((v) => fmtBytes(v, 1)) }],
    cursor: {
      drag: { x: true, y: false, setScale: true },
      points: { show: false },
      y: false,
      bind: { mousedown: panOnShiftDrag },
    },
    series: [{}],
    hooks: {
      drawClear: [drawPhaseBands],
      draw: [drawPhaseLabels, drawCapacityAndPeak],
      setCursor: [showTip],
      setScale: [() => { pickCache = [NaN, 0]; }],
    },
  };
  const step = uPlot.paths.stepped({ align: 1 });
  for (let c = cats.length - 1; c >= 0; c--) {
    opts.series.push({ label: cats[c][1], stroke: cats[c][2], fill: cats[c][2], width: 1, paths: step, points: { show: false } });
  }
  const u = new uPlot(opts, stacked(), chartEl);
  state.plot = u;

  cats.forEach((cat, c) => {
    const item = el("button", "vl-item");
    item.type = "button";
    item.dataset.category = cat[0];
    item.setAttribute("aria-pressed", "true");
    const sw = el("span", "vl-swatch");
    sw.style.background = cat[2];
    item.appendChild(sw);
    item.appendChild(el("span", null, cat[1]));
    item.addEventListener("click", () => {
      hidden[c] = !hidden[c];
      pickCache = [NaN, 0];
      item.classList.toggle("off", hidden[c]);
      item.setAttribute("aria-pressed", String(!hidden[c]));
      const min = u.scales.x.min, max = u.scales.x.max;
      u.batch(() => {
        u.setSeries(seriesOf(c), { show: !hidden[c] });
        u.setData(stacked(), false);
        u.setScale("x", { min, max });
      });
    });
    legendEl.appendChild(item);
  });

  u.over.addEventListener("wheel", (e) => {
    e.preventDefault();
    const min = u.scales.x.min, max = u.scales.x.max, at = u.posToVal(e.offsetX, "x");
    const f = e.deltaY < 0 ? 0.8 : 1.25;
    setX(u, at - (at - min) * f, at + (max - at) * f);
  }, { passive: false });
  u.over.addEventListener("mouseleave", () => { tip.hidden = true; });
  const pan = (dir) => { const min = u.scales.x.min, max = u.scales.x.max, d = (max - min) * 0.25 * dir; setX(u, min + d, max + d); };
  document.getElementById("vl-left").addEventListener("click", () => pan(-1));
  document.getElementById("vl-right").addEventListener("click", () => pan(1));
  document.getElementById("vl-reset").addEventListener("click", () => setX(u, xs[0], xs[last]));
  window.addEventListener("resize", () => u.setSize({ width: Math.max(320, chartEl.clientWidth), height: HEIGHT }));
})();
