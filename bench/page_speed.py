"""From a link to a drawn heatmap: the page's time for a long prompt against the API's for the same readout.

Starts `lensapp serve` (its result cache on, as deployed: a link's readout starts while its page
loads, see `ui/prefetch.py`), then for prompts of about 5 and 400 tokens, each prompt used once so
every readout is computed: the `/lens` API's time, and the time from opening the permalink in
headless Chromium to the heatmap's cells being in the page (and, for the long one, to the whole readout in the
page: its window's slider shown). Goal: the heatmap within 1.5x the API. Needs
Debian's chromium and the Python playwright package (`make test` installs both).

    python bench/page_speed.py [--repeats 3] [--url http://127.0.0.1:7860/] [--no-prefetch]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import App, client  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SENTENCE = ("The river runs through the old town, past the market and the school, and on to the sea. ")


def prompts(n_words: int, repeats: int) -> list[str]:
    """Distinct prompts of the same length (a different opening word each), so nothing is shared."""
    words = (SENTENCE * (n_words // 18 + 1)).split()[:n_words]
    return [f"Variant {i}: " + " ".join(words) for i in range(2 * repeats + 2)]


def page_time(browser, url: str, prompt: str, windowed: bool = False) -> tuple[float, float]:
    """Seconds from opening the link to its heatmap drawn, and to the whole readout in the page (a long prompt's
    picture is drawn from its window's readout first: `lensapp/ui/lens_tab.py`; the window's slider comes with
    the whole prompt's)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        t = time.perf_counter()
        page.goto(f"{url}?v=1&tab=logit&prompt={quote(prompt)}&layers=all&k=5")
        page.wait_for_selector("#logit-heatmap svg.marks g.role-mark path", timeout=600_000)
        drawn = time.perf_counter() - t
        if windowed:
            page.wait_for_selector("#logit-window", state="visible", timeout=600_000)
        return drawn, time.perf_counter() - t
    finally:
        page.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running app on loopback")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-prefetch", action="store_true",
                        help="start the app with the result cache off (so links do not prefetch)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    app = App(args.url, extra=["--cache-entries", "0"] if args.no_prefetch else [])
    results = {}
    try:
        c = client(app.url)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page_time(browser, app.url, "Warm up the page")
            for name, words in (("short", 4), ("long", 330)):
                texts = prompts(words, args.repeats)
                api = [api_time(c, t) for t in texts[:args.repeats]]
                pages = [page_time(browser, app.url, t, name == "long") for t in texts[args.repeats:2 * args.repeats]]
                n_tokens = len(c.predict(texts[-1], "logit", "last", 1, "", api_name="/lens")["input_tokens"])
                results[name] = {"tokens": n_tokens, "api_s": round(statistics.median(api), 2),
                                 "page_s": round(statistics.median(p[0] for p in pages), 2),
                                 "page_whole_s": round(statistics.median(p[1] for p in pages), 2)}
                results[name]["page_over_api"] = round(results[name]["page_s"] / results[name]["api_s"], 2)
            browser.close()
    finally:
        app.close()
    print(f"{'prompt':>6} {'tokens':>6} {'API':>7} {'page':>7} {'page/API':>9} {'whole':>7}   (medians of "
          f"{args.repeats}, seconds; whole: the whole readout in the page)")
    for name, r in results.items():
        print(f"{name:>6} {r['tokens']:>6} {r['api_s']:7.2f} {r['page_s']:7.2f} {r['page_over_api']:9.2f} "
              f"{r['page_whole_s']:7.2f}")
    print(json.dumps({"bench": "page_speed", **results}))
    return 0


def api_time(c, prompt: str) -> float:
    t = time.perf_counter()
    c.predict(prompt, "logit", "all", 5, "", api_name="/lens")
    return time.perf_counter() - t


if __name__ == "__main__":
    raise SystemExit(main())
