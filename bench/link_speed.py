"""A shared link's page against Gradio's own floor, side by side in one Chromium (issue 50).

The floor is a bare Gradio page this bench builds and serves itself: one Blocks, a textbox and a `gr.Plot`
whose load event returns a ready 30 x 7 Altair heatmap (built before the page is asked for). Beside it, the app
(`lensapp serve`, or --url) opens a fresh short link of each tab (`?tab=jacobian&prompt=<a prompt never asked>`):
for every repeat, the bare page and then one link per tab, each in a fresh browser context (nothing cached, as a
visitor following a link), and the same readout through the API with another fresh prompt. A page's time is
from the navigation's start to its first chart's first mark in the SVG ("chart"), and to the first picture of it
the visitor sees ("seen": a lens link's first view, `ui/first_view.py`, drawn before the page has started; else
the chart), in the page's own clock
(`bench/timeline.js`), which also says where it went: the HTML, the components first rendered, each load step
(sent, started, answered), the readout's step, its answer's size (the chart's JSON) and the drawing after it.
Medians of --repeats. The front page (no link) is measured too: it must keep drawing at once. Goal: a link's
chart within 1.5x of the bare page's. Needs Debian's chromium and Playwright (`make test` installs both).

    python bench/link_speed.py [--repeats 3] [--url http://127.0.0.1:7860/] [--tabs logit,jacobian]
    python bench/link_speed.py --width 390          # as a phone opens it
    python bench/link_speed.py --split-cores        # the app on the last core, the browser on the others
    python bench/link_speed.py --network 10,60      # every page over 10 Mbit/s with 60 ms round trips (a phone)

On one machine the browser shares the engine's cores: a link's prefetch (`ui/prefetch.py`) then slows the page's
own start. A visitor's browser is on another machine; --split-cores stands for that (the app's engine binds to the
one core it is allowed; every API time is then one core's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import App, client, fresh, split_cores  # noqa: E402

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Each tab's first chart, and the link's other values (the prompt is fresh each time).
CHARTS = {"logit": "#logit-heatmap", "jacobian": "#jacobian-heatmap", "generate": "#generate-heatmap",
          "compare": "#compare-heatmaps", "intervene": "#intervene-pair", "components": "#components-by-layer"}
BARE_CHART = "#bare-heatmap"
PROMPT = "The capital of France is"


def bare_page():
    """The floor: Gradio drawing a chart it already has. Returns the Blocks (not launched)."""
    import altair as alt
    import gradio as gr
    import pandas as pd

    cells = pd.DataFrame([{"position": f"{pos}: tok{pos}", "layer": layer, "p": (pos * 30 + layer) % 97 / 97,
                           "top": f"word{(pos * layer) % 13}"} for pos in range(7) for layer in range(30)])
    base = alt.Chart(cells).encode(x=alt.X("position:O"), y=alt.Y("layer:O", sort="descending"))
    chart = (base.mark_rect().encode(color=alt.Color("p:Q"), tooltip=["position", "layer", "top", "p"])
             + base.mark_text(fontSize=9).encode(text="top:N")).properties(
        width=7 * 60, height=30 * 16, usermeta={"embedOptions": {"renderer": "svg"}})   # as the app's charts draw
    with gr.Blocks(title="bare") as demo:
        gr.Textbox(label="Prompt", value=PROMPT)
        plot = gr.Plot(elem_id=BARE_CHART[1:])
        demo.load(lambda: chart, None, plot)
    return demo


def link_query(tab: str, prompt: str) -> str:
    """The short link a visitor shares: the tab and its prompt(s), every other value the tab's default."""
    from lensapp.ui import permalinks
    from lensapp.ui.views import View

    if tab == "compare":
        return permalinks.query_string(View(tab=tab, prompts=(prompt, prompt.replace("France", "Italy"))))
    return permalinks.query_string(View(tab=tab, prompt=prompt))


def api_seconds(c, tab: str, prompt: str) -> float:
    """The same readout through the API (`ui/api.py`: one endpoint per kind, its fields by name)."""
    from lensapp.ui.views import TAB_VIEWS, View

    view = TAB_VIEWS[tab]
    values = view.values_of(View(tab=tab, prompts=(prompt, prompt.replace("France", "Italy")))
                            if tab == "compare" else View(tab=tab, prompt=prompt))
    raw = {field.name: view.read(name, values) for name, field in view.request_fields().items()}
    if tab in ("logit", "jacobian"):
        raw["lens"] = "logit" if tab == "logit" else "both"
    if tab == "compare":
        raw["prompts"] = list(raw["prompts"])
    t = time.perf_counter()
    c.predict(**raw, api_name=f"/{view.kind}")
    return time.perf_counter() - t


def step_names(url: str) -> dict[int, str]:
    """Each event's name by its fn_index (the page's config)."""
    with urllib.request.urlopen(url + "config", timeout=30) as r:
        deps = json.load(r)["dependencies"]
    return {d["id"]: d.get("api_name") or (d.get("js") and "js") or f"fn{d['id']}" for d in deps}


def open_page(browser, url: str, chart: str, width: int, network: tuple[float, float] | None = None) -> dict:
    """One visit: its timeline (`timeline.js`) once the chart is drawn. `network`: (Mbit/s, round trip in ms)."""
    phone = width < 640
    context = browser.new_context(viewport={"width": width, "height": 844 if phone else 1000},
                                  is_mobile=phone, has_touch=phone)
    try:
        page = context.new_page()
        if network:
            throttle(context, page, *network)
        page.add_init_script(f"window.LENS_CHART = {json.dumps(chart)};")
        page.add_init_script(path=str(HERE / "timeline.js"))
        page.goto(url, wait_until="commit")
        page.wait_for_function("window.lensTimeline && window.lensTimeline.drawn !== null", timeout=600_000,
                               polling=100)
        timeline = page.evaluate("window.lensTimeline")
        timeline["html"] = page.evaluate("performance.getEntriesByType('navigation')[0].responseEnd")
        first_view = page.evaluate("window.lensFirstView ?? {}")     # ui/first_view.py's marks
        timeline["first_view"] = first_view.get("drawn")
        timeline["first_view_parts"] = {k: first_view.get(k) for k in ("asked", "vega")}
        timeline["first_view_parts"]["received"] = page.evaluate(   # its answer's last byte, whatever the page did
            "performance.getEntriesByType('resource').find((e) => e.name.includes('/first-view'))?.responseEnd")
        return timeline
    finally:
        context.close()


def throttle(context, page, mbps: float, rtt_ms: float) -> None:
    """The page's network as a visitor's far from the server: `mbps` each way, `rtt_ms` added to each round trip
    (Chromium's own emulation, counted on the bytes as sent: a compressed answer is a smaller one)."""
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    rate = mbps * 1e6 / 8
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": rtt_ms, "downloadThroughput": rate,
                                                  "uploadThroughput": rate})


def breakdown(timeline: dict, names: dict[int, str]) -> dict:
    """Where a page's time went, in seconds from the navigation's start: each load step (an event the page sent)
    until the chart was drawn, and the answer that carried the chart (its largest output: a step's last answer,
    or one of a generator's updates)."""
    s, drawn = 1e-3, timeline["drawn"]
    seen = {"seen_s": min(timeline.get("first_view") or drawn, drawn) * s}    # the first picture: a link's first view
    parts = timeline.get("first_view_parts") or {}
    seen.update({f"first_view_{k}_s": v * s for k, v in parts.items() if v is not None})   # its answer, its Vega
    by_event: dict = {}
    for m in timeline["msgs"]:
        by_event.setdefault(m.get("event"), []).append(m)
    steps, answers = [], []
    for join in (j for j in timeline["joins"] if j["sent"] < drawn):
        msgs = [m for m in by_event.get(join.get("event"), []) if m["t"] <= drawn]
        started = next((m["t"] for m in msgs if m["msg"] == "process_starts"), join["sent"])
        steps.append(f"{names.get(join['fn'], join['fn'])}@{join['sent'] * s:.2f}")
        answers += [{**m, "sent": join["sent"], "started": started, "step": steps[-1]} for m in msgs if m.get("items")]
    chart = max(answers, key=lambda m: max(m["items"]), default=None)
    if chart is None:
        return {"page_s": drawn * s, **seen, "html_s": timeline["html"] * s, "rendered_s": timeline["rendered"] * s,
                "steps": len(steps), "chain": steps, "chart_step": None}
    return {"page_s": drawn * s, **seen, "html_s": timeline["html"] * s, "rendered_s": timeline["rendered"] * s,
            "first_event_s": timeline["joins"][0]["sent"] * s, "steps": len(steps),
            "chart_sent_s": chart["sent"] * s, "chart_server_s": (chart["t"] - chart["started"]) * s,
            "chart_kb": max(chart["items"]) / 1024, "answer_kb": chart["bytes"] / 1024,
            "draw_s": (drawn - chart["t"]) * s, "chart_step": chart["step"], "chain": steps}


def serve_bare() -> str:
    """The bare page on a free loopback port, in this process; its URL."""
    demo = bare_page()
    demo.queue()
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True)
    return url if url.endswith("/") else url + "/"


def visits(browser, app_url: str, bare_url: str, tabs: list[str], repeats: int, width: int,
           network: tuple[float, float] | None = None) -> dict[str, list]:
    """Each repeat: the bare page, the front page, then a fresh link of each tab; timelines by what was opened."""
    names = {"app": step_names(app_url), "bare": step_names(bare_url)}
    out: dict[str, list] = {name: [] for name in ("bare", "front", *tabs)}
    for r in range(repeats):
        out["bare"].append(breakdown(open_page(browser, bare_url, BARE_CHART, width, network), names["bare"]))
        out["front"].append(breakdown(open_page(browser, app_url, CHARTS["jacobian"], width, network), names["app"]))
        for tab in tabs:
            query = link_query(tab, fresh(PROMPT, f"page{r}.{tab}"))
            out[tab].append(breakdown(open_page(browser, f"{app_url}?{query}", CHARTS[tab], width, network),
                                      names["app"]))
    return out


def medians(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out = {k: round(statistics.median(r[k] for r in runs if r.get(k) is not None), 3) for k in keys}
    return {**out, "chart_step": runs[0]["chart_step"], "chain": runs[-1]["chain"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running app on loopback (its result cache on: links prefetch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tabs", default=",".join(CHARTS), help="the tabs whose links are opened")
    parser.add_argument("--width", type=int, default=1400, help="the viewport's width (under 640: a phone, 844 high)")
    parser.add_argument("--no-api", action="store_true", help="skip the API's time for each readout")
    parser.add_argument("--split-cores", action="store_true",
                        help="the app on the last core, this bench and its browser on the others (2 cores or more)")
    parser.add_argument("--network", metavar="MBPS,RTT_MS",
                        help="every page over an emulated network: Mbit/s each way and milliseconds added to each "
                             "round trip (a phone on 4G: 10,60)")
    args = parser.parse_args(argv)
    tabs = [t for t in args.tabs.split(",") if t]
    unknown = sorted(set(tabs) - set(CHARTS))
    if unknown:
        parser.error(f"unknown tabs {unknown}; known: {', '.join(CHARTS)}")
    try:
        network = tuple(float(x) for x in args.network.split(",")) if args.network else None
    except ValueError:
        network = ()
    if network is not None and (len(network) != 2 or network[0] <= 0 or network[1] < 0):
        parser.error(f"--network is Mbit/s,milliseconds (e.g. 10,60); got {args.network!r}")
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    app_cores = None
    if args.split_cores:
        if args.url:
            parser.error("--split-cores needs an app this bench starts (no --url)")
        app_cores = split_cores()                           # this process, its bare page and its browser elsewhere
    bare_url = serve_bare()
    app = App(args.url, cores=app_cores)
    try:
        api = {} if args.no_api else api_times(app.url, tabs, args.repeats)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            open_page(browser, bare_url, BARE_CHART, args.width)                  # each server's first page
            open_page(browser, app.url, CHARTS["jacobian"], args.width)
            runs = visits(browser, app.url, bare_url, tabs, args.repeats, args.width, network)
            browser.close()
    finally:
        app.close()
    report({name: medians(r) for name, r in runs.items()}, api, args)
    return 0


def api_times(url: str, tabs: list[str], repeats: int) -> dict[str, float]:
    c = client(url)
    return {tab: round(statistics.median(api_seconds(c, tab, fresh(PROMPT, f"api{r}.{tab}")) for r in range(repeats)),
                       3) for tab in tabs}


def report(results: dict, api: dict, args) -> None:
    nan = float("nan")
    floor = results["bare"]["page_s"]
    print(f"medians of {args.repeats}, seconds from the navigation's start, {args.width} px wide; "
          f"bare = Gradio drawing a ready chart" + ("; the app on a core of its own" if args.split_cores else "")
          + (f"; over a network of {args.network} (Mbit/s, ms)" if args.network else ""))
    print(f"{'page':>10} {'seen':>6} {'/bare':>6} {'chart':>6} {'/bare':>6} {'API':>6} {'html':>5} {'render':>6} "
          f"{'1st ev':>6} {'steps':>5} {'sent':>5} {'server':>6} {'kB':>6} {'draw':>5}  the chart's step")
    for name, r in results.items():
        cells = [r.get(k, nan) for k in ("first_event_s", "steps", "chart_sent_s", "chart_server_s", "chart_kb",
                                         "draw_s")]
        print(f"{name:>10} {r['seen_s']:6.2f} {r['seen_s'] / floor:6.2f} {r['page_s']:6.2f} {r['page_s'] / floor:6.2f} "
              f"{api.get(name, nan):6.2f} {r['html_s']:5.2f} "
              f"{r['rendered_s']:6.2f} {cells[0]:6.2f} {cells[1]:5.0f} {cells[2]:5.2f} {cells[3]:6.2f} {cells[4]:6.1f} "
              f"{cells[5]:5.2f}  {r['chart_step']}")
    for name, r in results.items():
        print(f"  {name}: {' '.join(r['chain'])}")
    for name, r in results.items():
        if "first_view_asked_s" in r:
            print(f"  {name}'s first view: its chart's answer received at {r.get('first_view_received_s', nan):.2f}"
                  f" s and read at {r['first_view_asked_s']:.2f} s, Gradio's Vega "
                  f"loaded at {r.get('first_view_vega_s', nan):.2f} s, drawn at {r['seen_s']:.2f} s")
    print(json.dumps({"bench": "link_speed", "width": args.width, "repeats": args.repeats,
                      "split_cores": args.split_cores, "network": args.network, "api_s": api,
                      **{name: {k: v for k, v in r.items() if k != "chain"} for name, r in results.items()}}))


if __name__ == "__main__":
    raise SystemExit(main())
