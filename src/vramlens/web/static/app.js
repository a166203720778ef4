// vramlens calculator page: reads the form, asks the API (debounced), shows what it answers.
// No formula and no number formatting here: /api/estimate and /api/plan send every figure as
// bytes and as the string the command line prints. Select options come from /openapi.json,
// /api/models and /api/gpus; the form's starting values from the first estimate's workload.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const form = $("inputs");
  const IDS = {
    title: "title", fit: "fit", stack: "stack", legend: "legend", levels: "levels", breakdown: "breakdown",
    breakdownTitle: "breakdown-title", phases: "phases", serving: "serving", assumptions: "assumptions",
    settings: "settings",
  };
  let estimateSeq = 0;
  let planSeq = 0;
  let estimateAbort = null;
  let planAbort = null;
  let timers = {};
  let extra = {};  // keys of an uploaded run config that no form field holds (lora.*, attention, ...)
  // The first workload shown: one that fits the first GPU of the table (an H100), so the page
  // opens on an answer rather than on a refusal.
  const START = { method: "lora", precision: "bf16", recompute: "full" };

  function debounce(key, delay, fn) {
    clearTimeout(timers[key]);
    timers[key] = setTimeout(fn, delay);
  }

  function enumValues(schema, path) {
    let node = schema;
    for (const part of path.split(".")) node = node.properties[part];
    return node.enum;
  }

  function options(select, values) {
    select.replaceChildren(...values.map(([value, label]) => VL.el("option", { value }, label)));
  }

  function fields() {
    const mode = $("mode").value;
    return [...form.elements].filter((node) => {
      if (!node.name) return false;
      const set = node.closest("fieldset[data-mode]");
      return !set || set.dataset.mode === mode;
    });
  }

  function value(node) {
    if (node.type !== "number") return node.value;
    const text = node.value.trim();
    return text !== "" && Number.isInteger(Number(text)) ? Number(text) : text;
  }

  function workload() {
    const data = JSON.parse(JSON.stringify(extra));
    for (const node of fields()) {
      const v = value(node);
      if (node.name === "gpu" && v === "") continue;
      const [block, key] = node.name.includes(".") ? node.name.split(".") : [null, node.name];
      if (block) (data[block] = data[block] || {})[key] = v;
      else data[key] = v;
    }
    const size = $("gpu-size").value.trim();  // a size as the CLI's --gpu takes it replaces the choice
    if (size) data.gpu = size;
    // Asked on every change: training's reserved level from the closed form (~0.3 ms; the whole-step
    // replay, the CLI's default, takes 3-20 ms), said in the body so that "workload sent" reproduces it.
    if (data.mode !== "infer" && !("reserved_replay" in data)) data.reserved_replay = false;
    return data;
  }

  function setForm(normalized, gpuName) {
    for (const node of form.elements) {
      if (!node.name || node.name === "model" || node.name === "gpu") continue;
      const [block, key] = node.name.includes(".") ? node.name.split(".") : [null, node.name];
      const v = block ? normalized[block][key] : normalized[key];
      if (v !== null && v !== undefined) node.value = String(v);
    }
    $("gpu").value = gpuName || "";
    showMode();
  }

  function showMode() {
    for (const set of form.querySelectorAll("fieldset[data-mode]")) set.hidden = set.dataset.mode !== $("mode").value;
  }

  function showError(message) {
    const box = $("error");
    box.hidden = !message;
    box.textContent = message || "";
  }

  // An invalid input leaves no figure of the previous workload on the page.
  function clearResult() {
    for (const id of ["title", "fit", "settings"]) $(id).textContent = "";
    $("fit").className = "fit";
    for (const id of ["stack", "legend", "phases", "serving", "assumptions"]) $(id).replaceChildren();
    for (const id of ["levels", "breakdown"]) VL.fill($(id).tBodies[0], []);
    $("breakdown-title").textContent = "Breakdown at the peak";
  }

  async function estimateNow() {
    const seq = ++estimateSeq;
    if (estimateAbort) estimateAbort.abort();
    estimateAbort = new AbortController();
    const body = workload();
    document.body.dataset.state = "busy";
    try {
      const answer = await VL.postJSON("/api/estimate?report=false", body, estimateAbort.signal);
      if (seq !== estimateSeq) return;
      showError("");
      VL.showReport(answer.view, IDS);
      $("workload").textContent = JSON.stringify(body);
      document.body.dataset.state = "ready";
      document.body.dataset.seq = String(seq);
    } catch (error) {
      if (error.name === "AbortError" || seq !== estimateSeq) return;
      showError(error.message);
      clearResult();
      document.body.dataset.state = "error";
    }
  }

  async function planNow() {
    const seq = ++planSeq;
    if (planAbort) planAbort.abort();
    const section = $("plan-section");
    const body = workload();
    if (body.mode !== "train" || !body.gpu) {
      section.hidden = true;
      return;
    }
    planAbort = new AbortController();
    section.hidden = false;
    $("plan-title").textContent = "planning...";
    try {
      const answer = await VL.postJSON("/api/plan", { workload: body, top: 5 }, planAbort.signal);
      if (seq !== planSeq) return;
      const view = answer.view;
      $("plan-title").textContent = [view.title, view.searched, view.impossible].filter(Boolean).join("; ");
      VL.fill($("plan").tBodies[0], view.rows.map((row) =>
        VL.el("tr", {}, VL.el("td", { class: "num" }, String(row.rank)), VL.el("td", { class: "num" }, row.peak.text),
          VL.el("td", { class: "num" }, row.headroom.text), VL.el("td", { class: "num" }, row.relative_step_time),
          VL.el("td", {}, row.changes))));
    } catch (error) {
      if (error.name === "AbortError" || seq !== planSeq) return;
      $("plan-title").textContent = `planner: ${error.message}`;
      VL.fill($("plan").tBodies[0], []);
    }
  }

  function changed() {
    showMode();
    debounce("estimate", 150, estimateNow);
    debounce("plan", 400, planNow);
  }

  async function upload(file) {
    const note = $("upload-note");
    note.hidden = false;
    note.textContent = `reading ${file.name}...`;
    try {
      const data = await file.arrayBuffer();
      const answer = await VL.request(`/api/config?name=${encodeURIComponent(file.name)}`, {
        method: "POST", headers: { "Content-Type": "application/octet-stream" }, body: data,
      });
      note.textContent = answer.note;
      if (answer.kind === "config") {
        const select = $("model");
        if (![...select.options].some((o) => o.value === answer.model)) {
          select.append(VL.el("option", { value: answer.model }, `${answer.summary.name} (uploaded)`));
        }
        select.value = answer.model;
        changed();
      }
    } catch (error) {
      note.textContent = `${file.name}: ${error.message}`;
    }
  }

  // The keys of a run config: those the form shows go into its fields, the others into `extra`.
  function applyKeys(keys) {
    extra = JSON.parse(JSON.stringify(keys));
    if (keys.model) {
      const select = $("model");
      if (![...select.options].some((o) => o.value === keys.model)) {
        select.append(VL.el("option", { value: keys.model }, `${keys.model} (from the run config)`));
      }
      select.value = keys.model;
    }
    delete extra.model;
    for (const node of form.elements) {
      if (!node.name || node.name === "model" || node.name === "gpu") continue;
      const [block, key] = node.name.includes(".") ? node.name.split(".") : [null, node.name];
      const holder = block ? keys[block] || {} : keys;
      if (holder[key] === undefined || holder[key] === null) continue;
      node.value = String(holder[key]);
      if (block && extra[block]) delete extra[block][key];
      else if (!block) delete extra[key];
    }
    showMode();
  }

  async function runConfig(file) {
    const notes = $("source-notes");
    notes.hidden = false;
    VL.list(notes, [`reading ${file.name}...`]);
    try {
      const data = await file.arrayBuffer();
      const answer = await VL.request(`/api/from?name=${encodeURIComponent(file.name)}`, {
        method: "POST", headers: { "Content-Type": "application/octet-stream" }, body: data,
      });
      applyKeys(answer.keys);
      VL.list(notes, answer.assumptions);
      changed();
    } catch (error) {
      VL.list(notes, [`${file.name}: ${error.message}`]);
    }
  }

  async function downloadReport() {
    try {
      const blob = await VL.postJSON("/api/report.html", workload());
      VL.download(blob, `vramlens-${$("model").value.replace(/[^A-Za-z0-9._-]+/g, "-")}.html`);
    } catch (error) {
      showError(error.message);
    }
  }

  async function start() {
    const [schema, models, gpus] = await Promise.all([
      VL.request("/openapi.json"), VL.request("/api/models"), VL.request("/api/gpus"),
    ]);
    const workloadSchema = schema.paths["/api/estimate"].post.requestBody.content["application/json"].schema;
    for (const select of form.querySelectorAll("select[data-enum]")) {
      options(select, enumValues(workloadSchema, select.dataset.enum).map((v) => [v, v]));
    }
    options($("model"), models.map((m) => [m.name, `${m.name} (${m.parameters_text})`]));
    options($("gpu"), [["", "none (no fit check)"], ...gpus.map((g) => [g.name, `${g.name} (${g.memory.text})`])]);
    const first = models.some((m) => m.name === "llama-3.1-8b") ? "llama-3.1-8b" : models[0].name;
    const gpu = gpus.length ? gpus[0].name : "";
    const answer = await VL.postJSON("/api/estimate", { ...START, model: first, ...(gpu ? { gpu } : {}) });
    $("model").value = first;
    setForm(answer.report.workload, answer.report.gpu ? answer.report.gpu.name : "");
    const edited = (event) => {
      if (event.target.id !== "config-file" && event.target.id !== "run-config") changed();
    };
    form.addEventListener("input", edited);
    form.addEventListener("change", edited);
    $("config-file").addEventListener("change", (event) => {
      if (event.target.files.length) upload(event.target.files[0]);
    });
    $("run-config").addEventListener("change", (event) => {
      if (event.target.files.length) runConfig(event.target.files[0]);
    });
    $("download").addEventListener("click", downloadReport);
    form.addEventListener("submit", (event) => event.preventDefault());
    await estimateNow();
    planNow();
  }

  start().catch((error) => {
    showError(`the page could not start: ${error.message}`);
    document.body.dataset.state = "error";
  });
})();
