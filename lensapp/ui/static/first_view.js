// A link's first view (lensapp/ui/first_view.py): run by a link's page as it reads its HTML (server.WithFirstView
// writes it first in the head, its settings as JSON just before it: `settings_tag`). The link's first chart is asked
// for with the ticket the page's own GET was handed (`/first-view?t=`), Gradio's vega-embed module loaded at once,
// and the picture drawn over the page unless the tab has drawn its own already. While it covers the page it takes
// every click and tap (the controls under it are not seen: none of them is reached), and it goes as soon as the
// tab's own chart is drawn and shown (its tab's first chart, the one that carries `chart`, a tab's own
// declaration), or an error is shown, or after maxMs.
(() => {
  const settings = JSON.parse(document.getElementById("lens-first-view-settings").textContent);
  // Gradio starts the page when its <gradio-app> element is defined (its index module, which Vega's module
  // imports too): held until the picture is painted or there is none, so that its start does not keep the
  // picture's answer waiting on the browser's main thread. At holdMs after the navigation it starts unless all
  // the picture needs by then is to be drawn (its answer and Vega are in); at maxHoldMs it starts whatever the
  // drawing does.
  const define = customElements.define;
  let started = false, held = null;
  const start = () => {
    if (started) { return; }
    started = true;
    customElements.define = define;
    if (held) { held(); }
  };
  customElements.define = function (name, ...rest) {
    if (name !== "gradio-app" || started) { return define.call(this, name, ...rest); }
    held = () => define.call(customElements, name, ...rest);
  };
  const times = window.lensFirstView = {};            // when each part came (bench/link_speed.py reads them)
  const after = (ms) => Math.max(0, ms - performance.now());
  setTimeout(() => { if (!times.asked || !times.vega) { start(); } }, after(settings.holdMs));
  setTimeout(start, after(settings.maxHoldMs));
  // the tab's own chart, drawn and shown (a chart in a tab not shown has no box)
  const drawn = () => [...document.querySelectorAll(settings.chart)].some((plot) =>
    plot.getClientRects().length && plot.querySelector("svg.marks g.role-mark path"));
  const asked = fetch(new URL("first-view?t=" + encodeURIComponent(settings.ticket), location.href))
    .then((r) => (r.status === 200 ? r.json() : null)).catch(() => null)
    .then((spec) => { times.asked = performance.now(); return spec; });
  const vega = import("./assets/" + settings.embed).then((m) => m.default).catch(() => null)
    .then((embed) => { times.vega = performance.now(); return embed; });
  Promise.all([asked, vega]).then(async ([spec, embed]) => {
    if (!spec || !embed || drawn()) { start(); return; }
    spec.usermeta = { ...spec.usermeta, embedOptions: { ...spec.usermeta?.embedOptions, actions: false } };
    const view = document.createElement("div");
    view.id = settings.id;
    // Gradio's page is dark where the link says so or the browser prefers it: the picture's page is too (its chart
    // as Gradio draws it there, on Vega's white)
    const theme = new URLSearchParams(location.search).get("__theme");
    const dark = (theme || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light")) === "dark";
    view.classList.toggle("dark", dark);
    view.setAttribute("aria-hidden", "true");         // the page under it reads the same cells, and more
    view.innerHTML = "<p>The link's picture, while the page opens: hovering, the settings and the rest " +
      "follow in a moment.</p>";
    const box = document.createElement("div");
    box.className = "altair";                         // scrolled to its first chart's last column, as every chart
    const plot = document.createElement("div");
    plot.className = "lens-plot";
    plot.appendChild(box);
    view.appendChild(plot);
    document.body.appendChild(view);
    let due = false;
    const gone = () => { watch.disconnect(); view.remove(); };
    const watch = new MutationObserver(() => {         // looked at once a frame, not at each change of the page
      if (due) { return; }
      due = true;
      requestAnimationFrame(() => {
        due = false;
        if (drawn() || document.querySelector(".toast-body.error")) { gone(); }
      });
    });
    watch.observe(document, { childList: true, subtree: true });
    setTimeout(gone, settings.maxMs);
    await embed(box, spec, { renderer: "svg" });
    times.drawn = performance.now();
    times.started = started;                          // whether the page started before the picture was drawn
    requestAnimationFrame(() => setTimeout(start, 0));   // painted: the page starts
  }).catch(start);
})();
