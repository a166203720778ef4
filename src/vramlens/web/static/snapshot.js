// vramlens snapshot page: send a dropped file to /api/snapshot and show the view it answers
// (formatted on the server, as `vramlens view` prints it); "download" asks for the HTML report.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const IDS = {
    title: "title", fit: "fit", stack: "stack", legend: "legend", levels: "levels", breakdown: "breakdown",
    breakdownTitle: "breakdown-title", phases: "phases", assumptions: "assumptions",
  };
  let current = null;

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
  }

  function send(file, format) {
    const url = `/api/snapshot?name=${encodeURIComponent(file.name)}&format=${format}`;
    return VL.request(url, { method: "POST", headers: { "Content-Type": "application/octet-stream" }, body: file });
  }

  async function open(file) {
    current = file;
    document.body.dataset.state = "busy";
    showError("");
    try {
      const answer = await send(file, "json");
      VL.showReport(answer.summary, IDS);
      $("fit").hidden = answer.summary.fit.fits === null;
      $("source").textContent = answer.source;
      VL.fill($("top").tBodies[0], answer.top.map((row, index) =>
        VL.el("tr", {}, VL.el("td", { class: "num" }, String(index + 1)), VL.el("td", { class: "num" }, row.text),
          VL.el("td", {}, row.category), VL.el("td", {}, row.module || "-"), VL.el("td", {}, row.phase || "-"))));
      $("result").hidden = false;
      document.body.dataset.state = "ready";
    } catch (error) {
      showError(error.message);
      $("result").hidden = true;
      document.body.dataset.state = "error";
    }
  }

  $("snapshot-file").addEventListener("change", (event) => {
    if (event.target.files.length) open(event.target.files[0]);
  });
  const drop = $("drop");
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    if (event.dataTransfer.files.length) open(event.dataTransfer.files[0]);
  });
  $("download").addEventListener("click", async () => {
    if (!current) return;
    try {
      VL.download(await send(current, "html"), `${current.name}.html`);
    } catch (error) {
      showError(error.message);
    }
  });
})();
