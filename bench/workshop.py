"""A workshop for five minutes: thirty visitors, one of them replaying the heaviest legal request in a loop.

A room reaches a Space through one NAT address, and that is how the thirty come here: from one address of a network
namespace the bench makes (tests/netns.py: a veth pair on a private /29; needs root), each with the cookie its
browser got from loading the page and a session of its own as a page keeps one, to `lensapp serve` listening on the
pair's host end, serving the example workshop file (its settings: `--workshop`). Not from loopback, which no
per-address limit touches. The hostile crowd and the bench's own probes come from this machine with an address of
their own in X-Forwarded-For (10.77.N.M, private, made up here), which the app takes from its one trusted proxy hop
(`--trusted-proxies 1`), as a Space's proxy appends it. `--own-addresses` gives each of the thirty its own
X-Forwarded-For address instead, the app on loopback (the runs before issue 48). Nothing leaves this machine. Each
of the thirty first opens the page (a readout of the front page's example, ARRIVAL_GAP apart: a room arriving), then
all begin at once. The visitors, each in its own process (as thirty browsers are: one visitor reading a 30 MB answer
does not hold up the others' clocks), ask through the page's own route (Gradio's queue) with a client as light as a
browser's (`http_visitor.py`; `--client gradio` for gradio_client, whose own CPU took a third of these two cores):

  link      16 open the same shared link, then read it again now and then (the result cache's case)
  short     4 read a short prompt with the logit lens at every layer, over and over (the measured one)
  generate  5 generate 16 tokens, reading every layer at every step
  sweep     3 steer a 40-token prompt with twelve alphas, every layer read after each
  fit       2 steer with a fitted vector (the fitting desk: one at a time, in its own process)
  heavy     1 replays the heaviest request the app accepts (the first of a descending list it does)

With `--hostile`, a hostile crowd beside them (each its own address, 10.77.1.N):

  leaver    4 short sessions, one after another, each opening a distinct long link (the page, whose readout the
              app may start for it: ui/prefetch.py) and asking for that link's readout once, then leaving
  crawler   1 walks distinct long links (only the page's GET, five a second), never asking for a readout
  buster    1 varies a heavy request: a 160-word all-layer lens at k 90-100, its k and target changed each
              time (every one a distinct readout), as fast as it is answered

A person reads an answer before asking again: every visitor but the heavy one pauses a think time drawn
around `--think` seconds (a link visitor reads for 5 s; a refused one waits REFUSED_PAUSE). `--think 0` is the
stress case, everyone asking again the moment they have an answer; `--only KIND` runs one kind alone.

Reported: a short lens's p50 and p95 under the load against alone (goal: p95 within 5x), requests lost
(no answer, or an error that is not a polite refusal: goal 0), engine restarts (goal 0), refusals by kind,
the memory peak of the app and its processes, and the CPU seconds the app and the visitors' own processes
spent (the visitors share the app's cores here, as browsers elsewhere would not; `--visitor-niceness` nices
them). One JSON line at the end.

    python bench/workshop.py                      # 30 visitors, 5 minutes (about 8 minutes with start-up)
    python bench/workshop.py --minutes 1 --visitors 12
    python bench/workshop.py --minutes 3 --hostile --own-addresses --workshop ''   # as before issue 48
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import resource
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor

import psutil
from http_visitor import HttpVisitor, endpoints, page_cookie
from load import REPO, App, fresh

sys.path.insert(0, str(REPO / "tests"))
from netns import namespace, unavailable  # the tests' namespace, one helper for both

WORKSHOP = "workshops/where-does-the-answer-appear.yaml"
ARRIVAL_GAP = 0.25      # seconds between two of the thirty opening the page: a room arriving within ~8 s
CLONE_NEWNET = 0x40000000

EIFFEL = "The Eiffel Tower is located in the city of"
# What a page's first load reads: the front page's example (the same for everyone: the result cache's).
ARRIVAL = {"api_name": "/lens", "prompt": "The capital of France is", "lens": "logit", "layers": "all", "k": 5}
PARAGRAPH = ("The old harbour town wakes early. Fishing boats come back before the sun is high, and the market "
             "fills with people buying bread, fruit and the morning's catch. Children walk to school along the "
             "river, and the church bell rings the hour. ")
# Polite refusals: the app said no at once, in one line, and nothing was lost.
REFUSED = ("busy", "too many requests", "running or waiting", "the limit is", "try again")
# A refused visitor asks again after this long, as a person told "busy" would: asking again at once, three
# refused sweeps spent more CPU than the app in run J (2,131 refusals), on the cores the app shares here.
REFUSED_PAUSE = 2.0
# The visitors' processes' niceness. Thirty browsers are thirty other machines; here they share the app's two
# cores and took ~90% of one under the load (run M in bench/RESULTS.md). Niced (19), they took only what the app
# left, and with the app busy their own clients stalled: a short lens's engine part took 2.2 s, its visitor heard
# the answer after 7.1 s (run O). So they are not niced: the figures count their share of the cores against the app.
VISITOR_NICENESS = 0
# Seconds a person spends reading an answer before asking again (mean; each pause drawn from 0.5x to 1.5x):
# a lens chart of thirty layers, a generation's readout. Short for a workshop, where people change the prompt
# and read the chart; the heavy visitor never pauses (it is a script). See bench/RESULTS.md for --think 0.
THINK_S = 5.0


def heavy_candidates() -> list[dict]:
    """Requests near the budget, heaviest first: the first the app accepts is replayed."""
    long = (PARAGRAPH * 8).strip()
    targets = "Paris and the river, the old harbour town, bread and fruit, morning catch, school bell"
    out = []
    for words in (400, 300, 220, 160, 120):
        prompt = " ".join(long.split()[:words])
        out.append({"api_name": "/intervene", "prompt": prompt, "intervention": "patch",
                    "source": prompt.replace("harbour", "mountain"), "layer": "10-21", "layers": "last",
                    "targets": targets, "lens": "logit"})
        out.append({"api_name": "/lens", "prompt": prompt, "lens": "logit", "layers": "all", "k": 100,
                    "targets": targets})
    return out


class Visitor:
    def __init__(self, url: str, n: int, kind: str, api: dict | None = None, room: bool = False):
        """api: the app's endpoints (`http_visitor.endpoints`) for a browser-light client; None: gradio_client.
        room: one of the room (its process in the namespace): no forwarded address, a session of its own, and the
        cookie its browser keeps from loading the page."""
        self.kind, self.n = kind, n
        headers = {} if room else {"X-Forwarded-For": f"10.77.{1 if kind in HOSTILE else 0}.{n + 1}"}
        cookie = page_cookie(url) if room else None
        if cookie:
            headers["Cookie"] = cookie
        self.headers = headers
        if api is None:
            from gradio_client import Client

            self.client = Client(url, verbose=False, headers=headers)     # one session for its life
        else:
            self.client = HttpVisitor(url, api, headers, session=uuid.uuid4().hex[:11] if room else None)
        self.times: list[float] = []
        self.outcomes: Counter = Counter()
        self.cpu_s = 0.0                 # this visitor's process's CPU seconds (user + system), when it is done
        self.lost_at: list[float] = []   # when each lost request was asked for (epoch seconds)
        self.arrival: str | None = None  # what came of opening the page (the thirty only)

    def ask(self, **kw) -> str:
        """What came of one request: "answered", "refused" or "lost: <what the visitor heard>"."""
        api = kw.pop("api_name")
        t = time.perf_counter()
        try:
            self.client.predict(**kw, api_name=api)
            outcome = "answered"
            self.times.append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001 - what the visitor heard is the measure
            text = " ".join(str(e).split()).lower()
            outcome = "refused" if any(r in text for r in REFUSED) else f"lost: {text[:60]}"
        self.outcomes[outcome] += 1
        if outcome.startswith("lost"):
            self.lost_at.append(time.time() - (time.perf_counter() - t))
        return outcome


def long_link_prompt(n: int, i: int) -> str:
    """A distinct long prompt (about 120 words) for a hostile visitor's link."""
    return fresh(" ".join((PARAGRAPH * 3).split()[:120]), f"h{n}.{i}")


def request_of(kind: str, n: int, i: int, heavy: dict | None) -> dict:
    if kind == "leaver":
        return {"api_name": "/lens", "prompt": long_link_prompt(n, i), "lens": "logit", "layers": "all", "k": 5}
    if kind == "buster":
        words = " ".join((PARAGRAPH * 3).split()[:160])
        return {"api_name": "/lens", "prompt": words, "lens": "logit", "layers": "all", "k": 90 + i % 11,
                "targets": ["Paris", "bread", "river", "school"][i % 4]}
    if kind == "link":
        return {"api_name": "/lens", "prompt": EIFFEL, "lens": "logit", "layers": "all", "k": 5, "targets": "Paris"}
    if kind == "short":
        return {"api_name": "/lens", "prompt": fresh("The capital of France is", f"s{n}.{i}"), "lens": "logit",
                "layers": "all", "k": 5}
    if kind == "generate":
        return {"api_name": "/generate", "prompt": fresh("Once upon a time", f"g{n}.{i}"), "max_tokens": 16,
                "lens": "logit", "layers": "all", "k": 5}
    if kind == "sweep":
        return {"api_name": "/intervene", "prompt": fresh(PARAGRAPH[:200], f"w{n}.{i}"), "intervention": "steer",
                "word": "Rome", "layer": "20", "alphas": ",".join(f"{a / 10:g}" for a in range(12)),
                "lens": "logit", "layers": "all", "k": 3}
    if kind == "fit":
        return {"api_name": "/intervene", "prompt": fresh("The capital of France is", f"f{n}.{i}"),
                "intervention": "steer", "word": "Rome", "layer": "20", "direction": "fitted",
                "objective": "lens", "layers": "20,29", "k": 3}
    return dict(heavy)


HOSTILE = ["leaver"] * 4 + ["crawler", "buster"]


def plan(visitors: int, only: str | None = None, hostile: bool = False) -> list[str]:
    base = ["heavy"] + ["fit"] * 2 + ["sweep"] * 3 + ["generate"] * 5 + ["short"] * 4
    kinds = (base + ["link"] * max(0, visitors - len(base)))[:visitors] + (HOSTILE if hostile else [])
    return [k for k in kinds if only in (None, k)]


def open_link(url: str, prompt: str, headers: dict) -> str:
    """A page's GET of a long lens link (what a browser asks first); "answered" when the page came."""
    import urllib.request
    from urllib.parse import quote

    link = f"{url}?v=1&tab=logit&prompt={quote(prompt)}&layers=all&k=5"
    try:
        with urllib.request.urlopen(urllib.request.Request(link, headers=headers), timeout=30) as r:
            r.read()
            return "answered"
    except Exception as e:  # noqa: BLE001 - what the visitor heard is the measure
        return f"lost: {' '.join(str(e).split()).lower()[:60]}"


def choose_heavy(url: str, api: dict | None) -> dict:
    probe = Visitor(url, 250, "probe", api)
    for candidate in heavy_candidates():
        before = sum(probe.outcomes.values())
        probe.ask(**candidate)
        if probe.outcomes["answered"] and sum(probe.outcomes.values()) > before and probe.times:
            return candidate
        probe.outcomes.clear()
    raise SystemExit("error: the app refused every heavy candidate")


def memory_mb(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20
    except psutil.Error:
        return 0.0


def run(app: App, visitors: int, seconds: float, niceness: int = VISITOR_NICENESS, think: float = THINK_S,
        only: str | None = None, client: str = "http", hostile: bool = False, room: str | None = None) -> dict:
    """room: the network namespace the thirty ask from (None: each from its own forwarded address)."""
    url, pid = app.url, app.proc.pid if app.proc is not None else None
    api = endpoints(url) if client == "http" else None
    alone = Visitor(url, 240, "alone", api)
    settle(pid)                 # the app warms its examples up after it says ready: alone means alone (run AC)
    for i in range(5):
        alone.ask(**request_of("short", 240, i, None))
    heavy = choose_heavy(url, api)
    stop, peak = threading.Event(), [0.0]

    def watch_memory() -> None:
        while not stop.is_set() and pid is not None:
            peak[0] = max(peak[0], memory_mb(pid))
            time.sleep(1)

    kinds = plan(visitors, only, hostile)
    with multiprocessing.Manager() as manager, ProcessPoolExecutor(len(kinds)) as pool:
        # Every visitor's process starts and makes its client first (thirty interpreters importing gradio_client
        # at once hold both cores for seconds, which thirty browsers elsewhere would not), then all begin at once.
        ready = manager.Barrier(len(kinds) + 1)
        futures = [pool.submit(visit, url, n, kind, heavy, ready, seconds, niceness, think, api, room)
                   for n, kind in enumerate(kinds)]
        ready.wait(timeout=600)
        start, start_health, app_cpu = time.time(), app.health(), cpu_seconds(pid)
        watcher = threading.Thread(target=watch_memory, daemon=True)
        watcher.start()
        crowd = [f.result() for f in futures]
    stop.set()
    end_health = app.health()
    cpu = {"app_s": round(cpu_seconds(pid) - app_cpu), "visitors_s": round(sum(v.cpu_s for v in crowd)),
           "machine_s": round(seconds * psutil.cpu_count()), "visitors_niceness": niceness}
    lost_at = sorted(round(t - start) for v in crowd for t in v.lost_at)
    arrival = Counter(v.arrival for v in crowd if v.arrival is not None)
    refused = Counter("hostile" if v.kind in HOSTILE else "thirty" for v in crowd for _ in range(v.outcomes["refused"]))
    return report(alone, crowd, heavy, start_health, end_health, peak[0], seconds) | {
        "arrival": dict(arrival), "refused": dict(refused)} | {
        "cpu": cpu, "lost_at_s": lost_at, "think_s": think, "only": only, "client": client, "hostile": hostile,
        "prefetched": end_health.get("prefetch", {}), "sessions": end_health.get("sessions", {})}


def settle(pid: int | None, quiet: float = 0.15, most: float = 180.0) -> None:
    """Wait until the app's processes use under `quiet` of a core for two seconds running (at most `most` s)."""
    until, calm = time.time() + most, 0
    while pid is not None and time.time() < until and calm < 2:
        before = cpu_seconds(pid)
        time.sleep(1)
        calm = calm + 1 if cpu_seconds(pid) - before < quiet else 0


def visit(url: str, n: int, kind: str, heavy: dict, ready, seconds: float, niceness: int = 0,
          think: float = THINK_S, api: dict | None = None, room: str | None = None) -> Visitor:
    """One visitor, in a process of its own: its client made (one of the thirty: in the `room` namespace, when
    given), it opens the page (one of the thirty: ARRIVAL_GAP after the one before it), waits at `ready` (a barrier
    shared with every visitor and the bench), then asks for `seconds`, pausing as a person would; its record
    comes back."""
    os.nice(niceness)
    in_room = room is not None and kind not in HOSTILE
    if in_room:
        enter(room)
    v, i, draw = Visitor(url, n, kind, api, room=in_room), 0, random.Random(n)
    if kind not in HOSTILE:
        time.sleep(n * ARRIVAL_GAP)
        v.arrival = v.ask(**ARRIVAL)
        v.outcomes.clear()
        v.times.clear()
    ready.wait(timeout=600)
    until, before = time.time() + seconds, cpu_of_this_process()
    while time.time() < until:
        if kind in ("crawler", "leaver"):           # the page's GET of a distinct long link first
            page = open_link(url, long_link_prompt(n, i), v.headers)
            v.outcomes["page " + page] += 1
            if kind == "crawler":
                i += 1
                time.sleep(0.2)
                continue
        outcome = v.ask(**request_of(kind, n, i, heavy))
        i += 1
        if kind in ("link", "leaver"):
            time.sleep(5)
        elif outcome == "refused":
            time.sleep(REFUSED_PAUSE)
        elif kind != "heavy" and think > 0:
            time.sleep(think * draw.uniform(0.5, 1.5))
    v.client = None                     # what comes back is the record, not the connection
    v.cpu_s = cpu_of_this_process() - before
    return v


def enter(name: str) -> None:
    """This process's sockets from now on are made in the network namespace `name` (setns(2): Python 3.11 has no
    os.setns); the process must not have other threads yet."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{name}") as ns:
        if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter the network namespace {name}")


def cpu_of_this_process() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system) of the app and the processes it runs now (vLLM's, the fitter's)."""
    try:
        root = psutil.Process(pid)
        return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])
    except (psutil.Error, ValueError):
        return 0.0


def report(alone, crowd, heavy, start, end, peak_mb, seconds) -> dict:
    short = sorted(t for v in crowd if v.kind == "short" for t in v.times)
    solo = statistics.median(alone.times)
    by_kind: dict = defaultdict(Counter)
    for v in crowd:
        by_kind[v.kind].update(v.outcomes)
    lost = sum(n for c in by_kind.values() for k, n in c.items() if k.startswith("lost"))
    p95 = short[min(len(short) - 1, int(0.95 * len(short)))] if short else None
    return {"visitors": len(crowd), "seconds": seconds, "heavy": {k: v for k, v in heavy.items() if k != "prompt"}
            | {"prompt_words": len(heavy["prompt"].split())},
            "short_alone_s": round(solo, 3), "short_p50_s": round(statistics.median(short), 3) if short else None,
            "short_p95_s": round(p95, 3) if p95 else None, "p95_over_alone": round(p95 / solo, 2) if p95 else None,
            "requests_lost": lost, "engine_restarts": end["restarts"] - start["restarts"],
            "timed_out": end["calls"]["timed_out"] - start["calls"]["timed_out"],
            "by_kind": {k: dict(c) for k, c in by_kind.items()}, "memory_peak_mb": round(peak_mb)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visitors", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--visitor-niceness", type=int, default=VISITOR_NICENESS,
                        help="the visitors' processes' niceness (0: they compete with the app for its cores)")
    parser.add_argument("--think", type=float, default=THINK_S,
                        help="a person's mean seconds reading an answer before asking again (0: at once)")
    parser.add_argument("--hostile", action="store_true",
                        help="add the hostile crowd: short sessions on distinct long links, a crawler, a buster")
    parser.add_argument("--only", choices=["link", "short", "generate", "sweep", "fit", "heavy", *set(HOSTILE)],
                        help="run only this kind of visitor (of those --visitors plans)")
    parser.add_argument("--client", choices=["http", "gradio"], default="http",
                        help="the visitors' client: a browser-light one (http_visitor.py) or gradio_client")
    parser.add_argument("--own-addresses", action="store_true",
                        help="each of the thirty from an address of its own (X-Forwarded-For), not one room")
    parser.add_argument("--workshop", default=WORKSHOP,
                        help="the workshop file the app serves (its settings apply); '' for none")
    args = parser.parse_args()
    extra = ["--trusted-proxies", "1", *(["--workshop", args.workshop] if args.workshop else [])]
    with contextlib.ExitStack() as stack:
        room = None
        if not args.own_addresses:
            if unavailable():
                raise SystemExit(f"error: the room needs a network namespace: {unavailable()} (or --own-addresses)")
            room = stack.enter_context(namespace("wsroom"))
        app = App(None, extra=extra, host=room.host if room else "127.0.0.1")
        stack.callback(app.close)
        out = run(app, args.visitors, args.minutes * 60, args.visitor_niceness, args.think, args.only,
                  args.client, args.hostile, room.name if room else None)
        out["room"] = {"address": room.clients[0] if room else None, "workshop": args.workshop or None}
    for key, value in out.items():
        print(f"{key:>18}: {value}")
    print(json.dumps(out))
    return 0 if out["requests_lost"] == 0 and out["engine_restarts"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
