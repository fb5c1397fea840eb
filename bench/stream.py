"""A generation streamed step by step against the same generation answered once, and what a page sees of it.

Two parts, on the configured model (default: the embedded one on vLLM), each request distinct or the result cache
off, so every answer is computed:

  service   in this process: `LensService.generate` (one answer at the end) against `generate_stream` (a Partial
            per step, then the same result), 64 tokens, both lenses, every layer, k 5, rounds interleaved; and on
            the engine alone a longer generation (--long tokens, past the request's 64) streamed and not
  app       `lensapp serve` (result cache off): the /generate API's whole answer (`predict`) and its first frame
            (`submit`), then the Generation tab in headless Chromium: from the click to the first text, the first
            heatmap and the last redraw (the whole page)

Goals (issue 49): the streamed whole within 1.1x of the one-shot whole; the first readout on the page within 2 s
of the click; the page's last column within 1.2x of the API's whole. The last line is one JSON object.

    python bench/stream.py [--repeats 3] [--long 192] [--skip-app] [--url http://127.0.0.1:7860/] [--browser-nice 19]
    python bench/stream.py --skip-service --split-cores     # the app on the last core, the browser on the others

Chromium here shares the app's cores and takes them from the engine as it draws; a visitor's browser does not.
--split-cores stands for that: the app (engine and web process) on one core, this bench and its browser on the
others, so the API's whole and the page's are both one core's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKENS = 64
STORY = "Write a long story about a dragon who learns to paint. Chapter {}:"
# Every value the generated text shows and every heatmap redraw (a new chart drawn: Vega's SVG replaced; not the
# status timer Gradio puts in the plot's block), with their times (ms since the page's origin).
RECORD = """() => {
  window.__texts = []; window.__plots = [];
  const box = () => document.querySelector('#generate-text textarea');
  const plot = document.querySelector('#generate-heatmap');
  let drawnSvg = plot.querySelector('svg.marks');
  new MutationObserver(() => {
    const svg = plot.querySelector('svg.marks');
    if (svg && svg !== drawnSvg && svg.querySelector('g.role-mark path')) {
      drawnSvg = svg; window.__plots.push(performance.now());
    }
  }).observe(plot, {childList: true, subtree: true});
  setInterval(() => {
    const b = box(), t = window.__texts;
    if (b && (!t.length || t[t.length - 1][1] !== b.value)) t.push([performance.now(), b.value]);
  }, 10);
}"""


def median(xs) -> float:
    return round(statistics.median(xs), 2)


def service_part(repeats: int, long_tokens: int) -> dict:
    from lensapp import config
    from lensapp.engine.run.protocol import Sampling
    from lensapp.engine.run.step_stream import Step
    from lensapp.service import LensService
    from lensapp.service.requests import GenerateRequest

    config.prepare_process_environment()
    service = LensService.start(config.Config.of(cache_entries=0, request_timeout=600))   # a busy host: no deadline hit
    service.wait_ready(900)
    try:
        once, streamed, first = [], [], []
        for i in range(repeats + 1):                     # the first round warms up, untimed
            req = GenerateRequest.parse(prompt=STORY.format(i), max_tokens=TOKENS, lens="both", layers="all", k=5)
            t = time.perf_counter()
            whole = service.generate(req)
            t_once = time.perf_counter() - t
            t, seen = time.perf_counter(), None
            for item in service.generate_stream(req):
                seen = seen or time.perf_counter() - t
                last = item
            t_stream = time.perf_counter() - t
            assert last.to_json() == whole.to_json(), "the streamed result differs from the one-shot one"
            if i:
                once.append(t_once), streamed.append(t_stream), first.append(seen)
        spec = service.generator.plan(req).specs[0]
        sampling = Sampling(long_tokens)
        long_once, long_streamed, long_first = [], [], []
        for _ in range(repeats):
            t = time.perf_counter()
            n = len(service.engine.generate(spec, sampling).token_ids)
            long_once.append(time.perf_counter() - t)
            t, seen = time.perf_counter(), None
            for item in service.engine.generate_steps(spec, sampling):
                if isinstance(item, Step) and seen is None:
                    seen = time.perf_counter() - t
            long_streamed.append(time.perf_counter() - t)
            long_first.append(seen)
    finally:
        service.close()
    return {"tokens": len(whole.token_ids), "once_s": median(once), "streamed_s": median(streamed),
            "streamed_over_once": round(statistics.median(streamed) / statistics.median(once), 3),
            "first_step_s": median(first), "long": {"tokens": n, "once_s": median(long_once),
                                                    "streamed_s": median(long_streamed),
                                                    "first_step_s": median(long_first)}}


def api_times(c, prompt: str) -> tuple[float, float, float]:
    """(predict's whole, submit's first frame, submit's whole) in seconds."""
    args = (prompt, TOKENS, "both", "all", 5)
    t = time.perf_counter()
    c.predict(*args, api_name="/generate")
    whole = time.perf_counter() - t
    t = time.perf_counter()
    job = c.submit(*args, api_name="/generate")
    while not job.outputs() and not job.done():
        time.sleep(0.005)
    first = time.perf_counter() - t
    job.result()
    return whole, first, time.perf_counter() - t


def settled(app, page, timeout: float = 600) -> None:
    """Wait until the front page's own examples are drawn (computed: the result cache is off): clicked before, the
    generation shares the engine with them and their charts land after the click (the first run of this bench did,
    and timed the examples: first text 3.1 s, last column 21.0 s)."""
    page.wait_for_function("() => document.querySelector('#generate-text textarea')?.value", timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = app.health()
        if not h["admitted"] and not h["in_flight"]:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the page's examples did not end in {timeout} s")


def page_times(browser, app, prompt: str) -> tuple[float, ...]:
    """(first text, first heatmap, last heatmap redraw, the app done) in seconds after the Generate click: Chromium
    runs on the app's machine here, so its drawing takes the engine's cores too (a visitor's browser does not)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(app.url)
        page.get_by_role("tab", name="Generation").first.click()
        settled(app, page)
        page.locator("#generate-prompt textarea").fill(prompt, timeout=600_000)
        page.locator("#generate-max-tokens input[type=number]").fill(str(TOKENS))
        page.locator("#generate-lens input[value=both]").check()
        page.locator("#generate-heatmap").wait_for(state="attached")
        page.evaluate(RECORD)
        before = page.locator("#generate-text textarea").input_value()
        clicked = page.evaluate("performance.now()")
        page.locator("#generate-run").click()
        page.wait_for_function("() => window.__texts.length > 1", timeout=600_000)
        while app.health()["admitted"]:                   # the generation ends, then the page's last redraw
            time.sleep(0.1)
        served = page.evaluate("performance.now()")     # the app done with it (within 0.1 s): the rest is drawing
        quiet_since = time.monotonic()
        plots = page.evaluate("window.__plots.length")
        while time.monotonic() - quiet_since < 3:         # the page done: no redraw for 3 s
            time.sleep(0.25)
            if page.evaluate("window.__plots.length") != plots:
                plots, quiet_since = page.evaluate("window.__plots.length"), time.monotonic()
        texts = [t for t, v in page.evaluate("window.__texts") if v and v != before and t > clicked]
        drawn = [t for t in page.evaluate("window.__plots") if t > clicked]
        return tuple((t - clicked) / 1000 for t in (texts[0], drawn[0], drawn[-1], served))
    finally:
        page.close()


def chromium_at(nice: int) -> str:
    """Chromium, or Chromium run at `nice`: it then draws when the app leaves the cores idle, as a visitor's browser
    on a machine of its own would not take them from the app at all (a wrapper script in a temporary folder)."""
    if not nice:
        return CHROMIUM
    wrapper = Path(tempfile.mkdtemp(prefix="bench-stream-")) / "chromium"
    wrapper.write_text(f'#!/bin/sh\nexec nice -n {int(nice)} {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def app_part(url: str | None, repeats: int, browser_nice: int = 0, app_cores: set[int] | None = None) -> dict:
    from load import App, client
    from playwright.sync_api import sync_playwright

    app = App(url, extra=["--cache-entries", "0", "--request-timeout", "600"], cores=app_cores)
    try:
        c = client(app.url)
        api, pages = [], []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_at(browser_nice), args=ARGS)
            page_times(browser, app, STORY.format("warm"))
            for i in range(repeats):                     # interleaved: the API's round, then the page's
                api.append(api_times(c, STORY.format(f"api {i}")))
                pages.append(page_times(browser, app, STORY.format(f"page {i}")))
            browser.close()
    finally:
        app.close()
    out = {"api_whole_s": median(a[0] for a in api), "api_first_frame_s": median(a[1] for a in api),
           "api_streamed_whole_s": median(a[2] for a in api), "page_first_text_s": median(p[0] for p in pages),
           "page_first_heatmap_s": median(p[1] for p in pages), "page_last_column_s": median(p[2] for p in pages),
           "page_served_s": median(p[3] for p in pages)}
    out["page_over_api"] = round(out["page_last_column_s"] / out["api_whole_s"], 2)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long", type=int, default=192, help="tokens of the engine's longer generation")
    parser.add_argument("--skip-service", action="store_true")
    parser.add_argument("--skip-app", action="store_true")
    parser.add_argument("--url", help="a running app on loopback (started here otherwise)")
    parser.add_argument("--browser-nice", type=int, default=0,
                        help="run Chromium at this nice (19: it draws only when the app leaves a core idle, nearer a "
                             "visitor's browser on its own machine than Chromium on the app's cores)")
    parser.add_argument("--split-cores", action="store_true",
                        help="the app on the last core, this bench and its browser on the others (2 cores or more)")
    args = parser.parse_args(argv)
    if args.split_cores and args.url:
        parser.error("--split-cores needs an app this bench starts (no --url)")
    results = {"load_before": round(os.getloadavg()[0], 2)}
    if not args.skip_service:
        s = results["service"] = service_part(args.repeats, args.long)
        print(f"service, {s['tokens']} tokens: one answer {s['once_s']:.2f} s, streamed {s['streamed_s']:.2f} s "
              f"({s['streamed_over_once']:.3f}x), first step {s['first_step_s']:.2f} s")
        g = s["long"]
        print(f"engine, {g['tokens']} tokens: one answer {g['once_s']:.2f} s, streamed {g['streamed_s']:.2f} s, "
              f"first step {g['first_step_s']:.2f} s")
    if not args.skip_app:
        from load import split_cores

        app_cores = split_cores() if args.split_cores else None
        a = results["app"] = app_part(args.url, args.repeats, args.browser_nice, app_cores)
        print(f"API /generate {TOKENS} tokens: predict {a['api_whole_s']:.2f} s; submit: first frame "
              f"{a['api_first_frame_s']:.2f} s, whole {a['api_streamed_whole_s']:.2f} s")
        print(f"page: first text {a['page_first_text_s']:.2f} s, first heatmap {a['page_first_heatmap_s']:.2f} s, "
              f"last column {a['page_last_column_s']:.2f} s ({a['page_over_api']:.2f}x the API's whole), the app "
              f"done at {a['page_served_s']:.2f} s")
    results["load_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps({"bench": "stream", "repeats": args.repeats, "browser_nice": args.browser_nice,
                      "split_cores": args.split_cores, **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
