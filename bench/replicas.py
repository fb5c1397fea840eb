"""One engine on two cores against two engines on one core each, behind one page (`--engine-url A,B`), and one
engine killed under load.

Each layout's engines are `lensapp engine` services (the embedded model), each bound to its cores with `taskset`
(the engine binds vLLM's worker to the cores it may use: engine/start/cpu_env.py); the page is a `LensService`
in this process on their URLs (no result cache), and the load comes from 16 client threads at once:
  load      16 short readouts (every layer, logit lens) and 8 seeded generations (16 tokens), all submitted at
            once: throughput (requests/s over the wall time) and each kind's p50 and p95 latency
  kill      the same load on two engines, and `kill -9` of the first engine's process group once it has work in
            flight: requests lost (goal 0), the longest wait after the kill, and the time from the kill until the
            engine, started again at once on its port, serves the page again (vLLM's start included)

    python bench/replicas.py [--rounds 2] [--no-kill]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lensapp import config  # noqa: E402

KEY = secrets.token_urlsafe(32)
os.environ["LENSAPP_ENGINE_KEY"] = KEY          # the engines started here read it (never argv)
CLIENTS = 16
READOUTS, GENERATIONS, NEW_TOKENS = 16, 8, 16
LAYOUTS = {"one engine, 2 cores": ["0,1"], "two engines, 1 core each": ["0", "1"]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A `lensapp engine` on `cores` (taskset), its log, started and restarted on one port."""

    def __init__(self, cores: str, logs: Path):
        self.cores, self.port = cores, free_port()
        self.log = logs / f"engine-{self.port}.log"
        self.url, self.starts = f"http://127.0.0.1:{self.port}", 0
        self.start()

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
        self.proc = subprocess.Popen(["taskset", "-c", self.cores, sys.executable, "-m", "lensapp", "engine",
                                      "--port", str(self.port)], cwd=REPO, env=env, stdout=open(self.log, "a"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def ready(self) -> None:
        while self.log.read_text().count("engine ready") < self.starts:
            if self.proc.poll() is not None:
                raise SystemExit(f"lensapp engine exited:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.5)

    def stop(self, sig=signal.SIGTERM) -> None:
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=120)
        except ProcessLookupError:
            pass


def requests():
    from lensapp.service import GenerateRequest, LensRequest

    # Each readout its own prompt: none answered from another one's work.
    shorts = [LensRequest(prompts=(f"Item {i}: the capital of France is",), lens="logit", k=5) for i in range(READOUTS)]
    gens = [GenerateRequest(prompt="Once upon a time", max_tokens=NEW_TOKENS, temperature=0.8, seed=i, lens="logit",
                            k=3) for i in range(GENERATIONS)]
    return [("readout", r) for r in shorts] + [("generation", g) for g in gens]


def one_load(page, during=None) -> dict:
    """Every request at once from CLIENTS threads; `during(futures)` runs while they do (the kill)."""
    def ask(item):
        kind, req = item
        t = time.perf_counter()
        try:
            page.lens(req) if kind == "readout" else page.generate(req)
            return kind, time.perf_counter() - t, time.perf_counter(), None
        except Exception as e:  # noqa: BLE001 - a lost request is what this counts
            return kind, time.perf_counter() - t, time.perf_counter(), f"{type(e).__name__}: {e}"

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as threads:
        futures = [threads.submit(ask, item) for item in requests()]
        extra = during(futures) if during else {}
        done = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    out = {"wall_s": round(wall, 2), "per_s": round(len(done) / wall, 2),
           "lost": [e for *_, e in done if e], **extra}
    for kind in ("readout", "generation"):
        times = sorted(s for k, s, _, e in done if k == kind and not e)
        if times:
            out[kind] = {"p50_s": round(statistics.median(times), 2),
                         "p95_s": round(times[min(len(times) - 1, int(0.95 * len(times)))], 2)}
    if "killed_at" in extra:
        out["longest_wait_after_kill_s"] = round(max(end for _, _, end, _ in done) - extra.pop("killed_at"), 2)
    return out


def page_on(engines):
    from lensapp.service import LensService

    page = LensService.start(config.Config.of(engine_url=",".join(e.url for e in engines), engine_key=KEY,
                                              cache_entries=0, jlens="none", request_timeout=600))
    page.wait_ready(600)
    return page


def kill_first(page, engines):
    killed: list[float] = []

    def during(futures) -> dict:
        while page.health()["engines"][0]["in_flight"] == 0 and not all(f.done() for f in futures):
            time.sleep(0.05)
        engines[0].stop(signal.SIGKILL)
        killed.append(time.perf_counter())
        engines[0].start()                            # at once, as a supervisor would
        return {"killed_at": killed[0]}
    out = one_load(page, during)
    t = killed[0]
    while not page.health()["engines"][0]["up"]:
        time.sleep(0.5)
    answered = page.health()["engines"][0]["answered"]
    from lensapp.service import LensRequest

    page.lens(LensRequest(prompts=("The capital of France is",), lens="logit", k=5))    # alone: to the first
    out["serves_again_after_s"] = round(time.perf_counter() - t, 1)
    out["served_by_it_again"] = page.health()["engines"][0]["answered"] > answered
    out["engines"] = page.health()["engines"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="loads per layout (the best round is reported)")
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 under load")
    args = parser.parse_args()
    config.prepare_process_environment()          # before nnsight is imported (the page here imports it)
    logs = Path(tempfile.mkdtemp(prefix="replicas-"))
    results: dict = {}
    for name, cores in LAYOUTS.items():
        engines = [Served(c, logs) for c in cores]
        page = None
        try:
            for e in engines:
                e.ready()
            page = page_on(engines)
            one_load(page)                                # warm: the page's first requests
            rounds = [one_load(page) for _ in range(args.rounds)]
            results[name] = max(rounds, key=lambda r: r["per_s"])
            if len(engines) > 1 and not args.no_kill:
                results["kill -9 of one of two engines"] = kill_first(page, engines)
        finally:
            if page is not None:
                page.close()
            for e in engines:
                e.stop()
    print(f"{'layout':34} {'req/s':>6} {'readout p50/p95 s':>18} {'generation p50/p95 s':>21} {'lost':>5}")
    for name, r in results.items():
        ro, ge = r.get("readout", {}), r.get("generation", {})
        print(f"{name:34} {r['per_s']:>6} {ro.get('p50_s', '-')!s:>8}/{ro.get('p95_s', '-')!s:<9} "
              f"{ge.get('p50_s', '-')!s:>10}/{ge.get('p95_s', '-')!s:<10} {len(r['lost']):>5}")
    kill = results.get("kill -9 of one of two engines")
    if kill:
        print(f"kill -9: lost {len(kill['lost'])}, longest wait after it {kill['longest_wait_after_kill_s']} s, "
              f"serving again after {kill['serves_again_after_s']} s (its vLLM start included)")
    print(json.dumps({"bench": "replicas", "cpus": os.cpu_count(), **results}))


if __name__ == "__main__":
    main()
