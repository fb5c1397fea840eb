// Loaded into every page bench/link_speed.py opens, before the page's own scripts: what the page did when, in
// the page's clock (ms since the navigation started). Read back as window.lensTimeline.
//   joins:   each event the page sent (Gradio's queue/join: fn_index, sent, its event_id)
//   msgs:    each server message on the event stream (queue/data): when, what, its event, its bytes; a
//            completed step's output sizes, one per output
//   rendered: when the chart's element (CHART, set by the bench) first exists: Gradio has drawn the components
//   drawn:   when the chart's first mark is in its SVG (Vega has drawn it)
(() => {
  const timeline = window.lensTimeline = { joins: [], msgs: [], rendered: null, drawn: null };
  const now = () => performance.now();
  const plainFetch = window.fetch;

  function readStream(response) {
    const reader = response.body.getReader();
    const text = new TextDecoder();
    let buffered = "";
    const pump = () => reader.read().then(({ done, value }) => {
      if (done) { return; }
      const t = now();
      buffered += text.decode(value, { stream: true });
      const lines = buffered.split("\n");
      buffered = lines.pop();
      for (const line of lines) {
        if (line.startsWith("data:")) { record(line.slice(5).trim(), t); }
      }
      return pump();
    }).catch(() => {});
    pump();
  }

  function record(data, t) {
    let m = {};
    try { m = JSON.parse(data); } catch (e) { return; }
    const entry = { t, msg: m.msg, event: m.event_id, bytes: data.length };
    if (m.output && Array.isArray(m.output.data)) {        // a step's answer, or a generator's update
      entry.items = m.output.data.map((x) => JSON.stringify(x === undefined ? null : x).length);
      entry.success = m.success;
    }
    timeline.msgs.push(entry);
  }

  window.fetch = async function (input, init) {
    const url = typeof input === "string" ? input : (input && input.url) || String(input);
    if (url.includes("queue/join")) {
      let body = {};
      try { body = JSON.parse((init && init.body) || "{}"); } catch (e) { /* not JSON: fn unknown */ }
      const join = { fn: body.fn_index, sent: now() };
      timeline.joins.push(join);
      const response = await plainFetch.apply(this, arguments);
      response.clone().json().then((d) => { join.event = d.event_id; }).catch(() => {});
      return response;
    }
    const response = await plainFetch.apply(this, arguments);
    if (url.includes("queue/data") && response.body) { readStream(response.clone()); }
    return response;
  };

  const watch = new MutationObserver(() => {
    const chart = document.querySelector(window.LENS_CHART || "#none");
    if (chart && timeline.rendered === null) { timeline.rendered = now(); }
    if (chart && timeline.drawn === null && chart.querySelector("svg.marks g.role-mark path")) {
      timeline.drawn = now();
      watch.disconnect();
    }
  });
  watch.observe(document, { childList: true, subtree: true });
})();
