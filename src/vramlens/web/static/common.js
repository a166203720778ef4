// vramlens web pages: shared helpers. Every number shown comes from the API already formatted
// (bytes beside the CLI's string for them): this file only places text and sizes bars.
// Text goes in through textContent only, never as HTML.
"use strict";

const VL = (() => {
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "class") node.className = value;
      else if (key === "style") Object.assign(node.style, value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  async function request(url, options) {
    const response = await fetch(url, options);
    const type = response.headers.get("content-type") || "";
    if (!response.ok) {
      let message = `HTTP ${response.status}`;
      if (type.startsWith("application/json")) message = (await response.json()).error || message;
      const error = new Error(message);
      error.status = response.status;
      throw error;
    }
    return type.startsWith("application/json") ? response.json() : response.blob();
  }

  function postJSON(url, body, signal) {
    return request(url, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
  }

  function bar(fraction, color) {
    const width = Math.max(0, Math.min(1, fraction)) * 100;
    return el("span", { class: "bar", style: { width: `${width.toFixed(2)}%`, background: color } });
  }

  // The breakdown as one stacked bar of the device-level peak, with a legend.
  function stack(container, legend, rows) {
    container.replaceChildren(
      ...rows.filter((r) => r.fraction > 0).map((r) =>
        el("span", { class: "seg", title: `${r.name} ${r.text} (${r.share})`, dataset: { category: r.category },
          style: { width: `${(r.fraction * 100).toFixed(3)}%`, background: r.color } }))
    );
    legend.replaceChildren(
      ...rows.map((r) => el("span", { class: "key" }, el("i", { style: { background: r.color } }), `${r.name} ${r.text}`))
    );
  }

  function phases(container, items) {
    container.replaceChildren(
      ...items.map((p) =>
        el("div", { class: p.peak ? "phase peak" : "phase", dataset: { phase: p.name } },
          el("span", { class: "pname" }, p.peak ? `${p.name} <- peak` : p.name),
          el("span", { class: "num" }, p.text),
          el("span", { class: "pbar" }, ...p.parts.map((part) =>
            el("span", { class: "seg", title: `${part.category} ${part.text}`,
              style: { width: `${(part.fraction * 100).toFixed(3)}%`, background: part.color } }))),
          el("span", { class: "pnote" }, p.note)))
    );
  }

  function list(node, items) {
    node.replaceChildren(...items.map((text) => el("li", {}, text)));
  }

  // A report's view (present_report on the server) into the elements of a page.
  function showReport(view, ids) {
    const $ = (id) => document.getElementById(id);
    $(ids.title).textContent = view.title;
    const fit = $(ids.fit);
    fit.textContent = view.fit.text;
    fit.className = view.fit.fits === null ? "fit" : view.fit.fits ? "fit ok" : "fit bad";
    if (ids.settings) $(ids.settings).textContent = view.settings || "";
    stack($(ids.stack), $(ids.legend), view.breakdown.rows);
    fill($(ids.levels).tBodies[0], view.levels.map((row) =>
      el("tr", { dataset: { level: row.level } }, el("td", {}, row.level), el("td", { class: "num" }, row.text),
        el("td", {}, row.what))));
    $(ids.breakdownTitle).textContent = view.breakdown.title;
    fill($(ids.breakdown).tBodies[0], view.breakdown.rows.map((row) =>
      el("tr", { dataset: { category: row.category } }, el("td", {}, row.name), el("td", { class: "num" }, row.text),
        el("td", { class: "num" }, row.share), el("td", { class: "barcell" }, bar(row.fraction, row.color)))));
    phases($(ids.phases), view.phases);
    if (ids.serving) list($(ids.serving), view.serving);
    list($(ids.assumptions), view.assumptions.length ? view.assumptions : ["none stated"]);
  }

  function download(blob, name) {
    const link = el("a", { href: URL.createObjectURL(blob), download: name });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }

  return { el, fill, request, postJSON, showReport, download, list };
})();
