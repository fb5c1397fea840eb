"""A workshop at once: many users against the running app, through its API, as their browsers would.

Starts `lensapp serve` on a free loopback port (or uses `--url`, which must be loopback), then runs
scenarios, each bounded in users and time, and prints a table per scenario and one JSON line:

  mix       N users at once, a mix of kinds: logit lens, both lenses, generation, chat, and one
            permalink everybody opens (the same /lens request); against the same requests one after
            another. p50/p95 per kind, errors by kind, lost requests (no answer within --timeout).
  link      the same link opened by 16 users at once: engine forwards spent (from /health).
  hol       a short lens request sent 2 s into another user's 32-token generation (both lenses, all
            layers), against the same lens request alone.
  generate  8 users generating 16 tokens at once, against one after another (every layer read at
            every step; then the last layer only).
  flood     48 users at once against an app whose queue holds fewer: every one answered or told
            "busy" at once; none lost.
  heal      8 users at work (generations and lenses) when vLLM's EngineCore is killed (SIGKILL, as an
            out-of-memory kill would): what each user heard, and seconds until the same web process
            answers a new request normally. Needs its own app (not --url).

    python bench/load.py                          # all scenarios on the embedded model (a few minutes)
    python bench/load.py --scenario link --scenario hol
    python bench/load.py --url http://127.0.0.1:7860/ --scenario mix --users 30
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("mix", "link", "hol", "generate", "flood", "heal")
PROMPTS = ["The capital of France is", "Water boils at", "The Eiffel Tower is located in the city of",
           "La capitale de la France est", "12 + 7 =", "The opposite of hot is", "My favourite colour is",
           "The largest planet in the solar system is"]
LINK = ("The Eiffel Tower is located in the city of", "logit", "all", 5, "Paris")
RUN = f"{os.getpid() % 10_000}"      # in every prompt: nothing is served from a previous run's cache


def fresh(prompt: str, tag: str) -> str:
    """The prompt, made unique to this run and `tag`: the app computes it, no cache or twin can answer it."""
    return f"({RUN}.{tag}) {prompt}"


# -- the app ---------------------------------------------------------------------------------------

def split_cores() -> set[int]:
    """Keep this process (and the browser it starts) off the last core; return {that core} for the app. It stands
    for a visitor's browser on a machine of its own (the app's engine binds to the one core it is allowed)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("error: splitting the cores needs 2 cores or more")
    os.sched_setaffinity(0, cores[:-1])
    return {cores[-1]}


class App:
    """`lensapp serve` in a subprocess on a free loopback port (or an app already running at --url). `host`: where it
    listens instead, an address of this machine's own (a network namespace's veth end: bench/workshop.py); the bench
    then reads the host's /health with a token of its own."""

    def __init__(self, url: str | None, extra: list[str] = (), env: dict | None = None, host: str = "127.0.0.1",
                 cores: set[int] | None = None):
        """cores: the only cores the app (and its engine, which binds to those it is allowed) may use."""
        self.proc, self.log = None, None
        self.token = None if host == "127.0.0.1" else os.urandom(16).hex()
        if url:
            host = urllib.parse.urlparse(url).hostname
            if host not in ("127.0.0.1", "localhost", "::1"):
                raise SystemExit("error: --url must be a loopback address: this bench only loads your own machine")
            self.url = url if url.endswith("/") else url + "/"
            return
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        self.url = f"http://{host}:{port}/"
        extra = [*extra, "--host", host] if self.token else extra
        env = {**(env or {}), "LENSAPP_HEALTH_TOKEN": self.token} if self.token else env
        self.log = open(REPO / "artifacts" / f"load-app-{port}.log", "w") if (REPO / "artifacts").is_dir() else None
        self.proc = subprocess.Popen([sys.executable, "-m", "lensapp", "serve", "--port", str(port), *extra],
                                     cwd=REPO, stdout=self.log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {}), "GRADIO_ANALYTICS_ENABLED": "False"},
                                     preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
        self.wait_ready()

    def health(self) -> dict:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        with urllib.request.urlopen(urllib.request.Request(self.url + "health", headers=headers), timeout=10) as r:
            return json.loads(r.read())

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SystemExit(f"error: the app exited with {self.proc.returncode}")
            try:
                h = self.health()
                # and every tab's example computed (ui/front.py): until then it holds the engine for ~15 s
                if h["state"] == "ready" and h.get("front_page", "ready") == "ready":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(1)
        raise SystemExit(f"error: the app at {self.url} was not ready within {timeout:.0f} s")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=120)


def client(url: str):
    from gradio_client import Client

    return Client(url, verbose=False)


# -- requests --------------------------------------------------------------------------------------

class Outcome:
    """What happened to one request: ok, an error (with its kind), or lost (no answer in time)."""

    def __init__(self, kind: str):
        self.kind, self.seconds, self.error, self.done = kind, None, None, threading.Event()


def call(c, kind: str, i: int, tag: str = ""):
    p = fresh(PROMPTS[i % len(PROMPTS)], f"{tag}{i}")
    if kind == "logit":
        return c.predict(p, "logit", "all", 5, "", api_name="/lens")
    if kind == "both":
        return c.predict(p, "both", "all", 5, "", api_name="/lens")
    if kind == "generate":
        return c.predict(p, 8, "logit", "all", 5, 0.0, api_name="/generate")
    if kind == "long":                              # ~60 tokens, every layer: about a second of work here
        return c.predict(p + " " + " ".join(PROMPTS) + " " + PROMPTS[i % len(PROMPTS)], "logit", "all", 5, "",
                         api_name="/lens")
    if kind == "chat":
        return c.predict([{"role": "user", "content": f"Say something about {p.split()[1]}."}], "logit", -1, 8,
                         0.0, 3, None, api_name="/chat")
    if kind == "link":                              # the same link for everybody in this phase
        return c.predict(fresh(LINK[0], tag), *LINK[1:], api_name="/lens")
    raise ValueError(kind)


def run_all(url: str, kinds: list[str], timeout: float, tag: str = "all", stagger: float = 0.0) -> list[Outcome]:
    """Every request at once (one client each), each with an answer deadline; lost = none by then."""
    clients = [client(url) for _ in kinds]
    outcomes = [Outcome(k) for k in kinds]

    def one(i: int) -> None:
        o = outcomes[i]
        t = time.perf_counter()
        try:
            call(clients[i], o.kind, i, tag)
        except Exception as e:  # noqa: BLE001 - every failure is counted by its message
            o.error = " ".join(str(e).split())[:80] or type(e).__name__
        o.seconds = time.perf_counter() - t
        o.done.set()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(kinds))]
    for th in threads:
        th.start()
        time.sleep(stagger)
    deadline = time.time() + timeout
    for o in outcomes:
        o.done.wait(max(0.0, deadline - time.time()))
    return outcomes


def sequential(url: str, kinds: list[str], tag: str = "seq") -> float:
    c = client(url)
    t = time.perf_counter()
    for i, kind in enumerate(kinds):
        call(c, kind, i, tag)
    return time.perf_counter() - t


def summarise(outcomes: list[Outcome]) -> dict:
    by_kind = defaultdict(list)
    for o in outcomes:
        if o.done.is_set() and o.error is None:
            by_kind[o.kind].append(o.seconds)
    out = {"answered": sum(o.done.is_set() and o.error is None for o in outcomes),
           "errors": dict(Counter(o.error for o in outcomes if o.done.is_set() and o.error)),
           "lost": sum(not o.done.is_set() for o in outcomes), "latency": {}}
    for kind, times in sorted(by_kind.items()):
        times.sort()
        out["latency"][kind] = {"n": len(times), "p50_s": round(statistics.median(times), 3),
                                "p95_s": round(times[min(len(times) - 1, int(0.95 * len(times)))], 3)}
    return out


# -- scenarios -------------------------------------------------------------------------------------

def mix(app: App, users: int, timeout: float) -> dict:
    pattern = ["logit", "both", "generate", "chat", "link"]
    kinds = [pattern[i % len(pattern)] for i in range(users)]
    seq = sequential(app.url, kinds)
    before = app.health()
    t = time.perf_counter()
    outcomes = run_all(app.url, kinds, timeout, tag="mix")
    wall = time.perf_counter() - t
    after = app.health()
    return {"users": users, "sequential_s": round(seq, 2), "concurrent_s": round(wall, 2),
            "throughput_x": round(seq / wall, 2), "cache_hits": _hits(after) - _hits(before), **summarise(outcomes)}


def link(app: App, users: int = 16, timeout: float = 300) -> dict:
    before = app.health()
    t = time.perf_counter()
    outcomes = run_all(app.url, ["link"] * users, timeout, tag="link")
    wall = time.perf_counter() - t
    after = app.health()
    forwards = after["forwards"].get("lens", 0) - before["forwards"].get("lens", 0)
    return {"users": users, "wall_s": round(wall, 2), "engine_forwards": forwards,
            "cache_hits": _hits(after) - _hits(before), **summarise(outcomes)}


def hol(app: App, timeout: float = 300) -> dict:
    c = client(app.url)

    def short_lens(tag):
        return _timed(lambda: c.predict(fresh("The capital of France is", tag), "logit", "all", 5, "",
                                        api_name="/lens"))
    short_lens("warm")
    alone = statistics.median(short_lens(f"alone{i}") for i in range(5))
    gen_client = client(app.url)
    done = {}

    def generate():
        done["gen_s"] = _timed(lambda: gen_client.predict(fresh("Once upon a time, in a land far away,", "gen"), 32,
                                                          "both", "all", 5, 0.0, api_name="/generate"))
    th = threading.Thread(target=generate)
    th.start()
    time.sleep(2.0)
    during = short_lens("during")
    th.join(timeout)
    return {"lens_alone_s": round(alone, 3), "lens_during_generation_s": round(during, 3),
            "ratio": round(during / alone, 2), "generation_s": round(done.get("gen_s", float("nan")), 2)}


def generate(app: App, users: int = 8, timeout: float = 300) -> dict:
    """Every layer read at every step (the Generate tab's default), and the last layer only: the
    second shows what batching does when the per-user readout is not most of the work."""
    out = _generate(app, users, "all")
    out["last_layer_only"] = _generate(app, users, "last")
    return out


def _generate(app: App, users: int, layers: str) -> dict:
    """Throughput in generated tokens per second (a reply may stop at EOS before 16, and which ones do
    depends on the prompt), at steady state: one untimed round of `users` at once first, as a
    workshop's first minute would be (a batch this size compiles its shapes once per process)."""
    prompts = [f"Story number {i}: once upon a time" for i in range(users)]
    clients = [client(app.url) for _ in prompts]

    def one(c, prompt: str, tag: str) -> int:
        out = c.predict(fresh(prompt, tag), 16, "logit", layers, 5, 0.0, api_name="/generate")
        return len(out["token_ids"])

    def together(tag: str) -> tuple[float, int]:
        t = time.perf_counter()
        with ThreadPoolExecutor(users) as pool:
            n = sum(pool.map(lambda a: one(a[0], a[1], f"{tag}{layers}{a[2]}"), zip(clients, prompts, range(users))))
        return time.perf_counter() - t, n

    together("warm")
    t = time.perf_counter()
    seq_tokens = sum(one(clients[0], p, f"seq{layers}{i}") for i, p in enumerate(prompts))
    seq = time.perf_counter() - t
    account = CpuAccount(app)
    conc, conc_tokens = together("conc")
    return {"users": users, "tokens": 16, "layers": layers, "sequential_s": round(seq, 2),
            "sequential_tokens": seq_tokens, "concurrent_s": round(conc, 2), "concurrent_tokens": conc_tokens,
            "throughput_x": round((conc_tokens / conc) / (seq_tokens / seq), 2),
            "concurrent_cpu_s": account.spent()}


class CpuAccount:
    """CPU seconds each process spent from now on: the web process, vLLM's EngineCore and worker, this
    bench's clients. On a small machine they share the same cores, so this says where a round's time went.
    Only for an app this bench started (its processes are known); empty with --url."""

    def __init__(self, app: App):
        self.procs = {}
        if app.proc is None:
            return
        import psutil

        web = psutil.Process(app.proc.pid)
        self.procs = {"web": web, "bench": psutil.Process()}
        for child in web.children(recursive=True):
            name = _name(child).removeprefix("VLLM::").lower()
            if not name:                    # gone while listed (a compile worker)
                continue
            self.procs[name if name not in self.procs else f"{name}-{child.pid}"] = child
        self.start = {name: self._cpu(p) for name, p in self.procs.items()}

    @staticmethod
    def _cpu(p) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except Exception:  # noqa: BLE001 - a process that is gone counts what it had
            return 0.0

    def spent(self) -> dict:
        spent = {name: round(self._cpu(p) - self.start[name], 2) for name, p in self.procs.items()}
        return {name: s for name, s in spent.items() if s > 0}     # not the idle helpers (resource tracker)


def flood(url: str | None, users: int = 48, timeout: float = 300) -> dict:
    """Against its own app with a small queue (8 at once, 8 waiting), 48 users each asking for a different,
    longer readout: those beyond what the app holds must hear 'busy' at once; none may be lost."""
    app = App(url, extra=["--max-batch", "8", "--queue-size", "8", "--cache-entries", "0"])
    try:
        kinds = ["long"] * users
        outcomes = run_all(app.url, kinds, timeout, tag="flood")
        busy = sorted(o.seconds for o in outcomes if o.error and ("busy" in o.error or "queue is full" in
                                                                   o.error.lower()))
        return {"users": users, "queue": "8 running + 8 waiting", **summarise(outcomes), "told_busy": len(busy),
                "busy_answer_p95_s": round(busy[int(0.95 * (len(busy) - 1))], 3) if busy else None}
    finally:
        app.close()


def heal(users: int = 8, timeout: float = 300) -> dict:
    import psutil

    app = App(None)
    try:
        core = next(p for p in psutil.Process(app.proc.pid).children(recursive=True)
                    if "EngineCore" in _name(p))
        restarts = app.health()["restarts"]
        kinds = ["generate" if i % 2 else "both" for i in range(users)]
        got: dict = {}
        runner = threading.Thread(target=lambda: got.update(outcomes=run_all(app.url, kinds, timeout, tag="heal")))
        runner.start()
        time.sleep(2.0)
        core.kill()
        killed = time.perf_counter()
        runner.join()
        c, back = client(app.url), None
        while back is None and time.perf_counter() - killed < timeout:
            try:
                c.predict(fresh("The capital of France is", f"heal{time.time()}"), "logit", "all", 5, "",
                          api_name="/lens")
                back = time.perf_counter() - killed
            except Exception:  # noqa: BLE001 - still restarting: ask again
                time.sleep(1.0)
        h = app.health()
        return {"users": users, **summarise(got["outcomes"]),
                "answered_again_after_s": round(back, 1) if back else None, "restarts": h["restarts"] - restarts,
                "state": h["state"], "same_web_process": app.proc.poll() is None}
    finally:
        app.close()


def _name(p) -> str:
    """A process's name, or "" for one that is gone."""
    import psutil

    try:
        return p.name()
    except psutil.Error:
        return ""


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _hits(health: dict) -> int:
    return health["cache"]["hits"] + health["cache"]["shared_in_flight"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running app (loopback only); default: start one here")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable; default: all")
    parser.add_argument("--users", type=int, default=30, help="users in the mix scenario (at most 64)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before an unanswered request is lost")
    args = parser.parse_args(argv)
    if not 1 <= args.users <= 64:
        parser.error("--users must be in 1..64")
    scenarios = args.scenario or list(SCENARIOS)
    results = {}
    if args.url and "heal" in scenarios:
        parser.error("the heal scenario kills the engine of an app it starts itself; it cannot use --url")
    app = App(args.url) if set(scenarios) - {"flood", "heal"} else None
    try:
        for name in scenarios:
            t = time.perf_counter()
            if name == "mix":
                results[name] = mix(app, args.users, args.timeout)
            elif name == "link":
                results[name] = link(app, timeout=args.timeout)
            elif name == "hol":
                results[name] = hol(app, args.timeout)
            elif name == "generate":
                results[name] = generate(app, timeout=args.timeout)
            elif name == "flood":
                results[name] = flood(None, timeout=args.timeout)
            else:
                results[name] = heal(timeout=args.timeout)
            results[name]["scenario_s"] = round(time.perf_counter() - t, 1)
            print(f"\n[{name}]")
            for key, value in results[name].items():
                print(f"  {key:>26}: {value}")
    finally:
        if app is not None:
            app.close()
    print(json.dumps({"bench": "load", **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
