"""A page on an engine service (`lensapp engine`, `--engine-url`) against the model in the page's process.

Measured one after the other, never two engines busy at once (they would share the two cores):
  start     `lensapp serve` to its first /lens readout (bench/startup.py's stopwatch): in-process, then with
            `--engine-url` while the engine service is up (the page alone: meta model, no weights)
  wire      one all-layer logit-lens request through the service layer (`LensService.lens`, no result
            cache), short (~17 tokens) and long (~300 tokens) prompt, median of --repeats, and 8 short
            ones at once; remote and in-process interleaved (both engines up, one busy at a time); the
            difference is the wire's cost: serializing the trace (timed here, with its size), HTTP, the
            server rebuilding it, and the answer's pickle
  engine    the engine service's own start to "ready" (vLLM, the Jacobian lens, the warm-up)

    python bench/engine_service.py [--repeats 9] [--starts 2]
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
sys.path.insert(0, str(REPO / "bench"))

from lens_speed import LONG_PARAGRAPH, SHORT  # noqa: E402
from startup import free_port, one_start  # noqa: E402

from lensapp import config  # noqa: E402

KEY = secrets.token_urlsafe(32)
os.environ["LENSAPP_ENGINE_KEY"] = KEY          # the engine and the pages started here read it (never argv)


def start_engine(port: int, log: Path) -> tuple[subprocess.Popen, float]:
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lensapp", "engine", "--port", str(port)],
                            cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    while "engine ready" not in log.read_text():
        if proc.poll() is not None:
            raise SystemExit(f"lensapp engine exited:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    return proc, time.perf_counter() - t


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)


def page_memory(cache: str, url: str) -> dict:
    """Resident memory of a `lensapp serve --engine-url` page (its process and any children) once ready, and
    the memory plan it logged (/health)."""
    import psutil
    from startup import _health

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lensapp", "serve", "--port", str(port), "--cache-dir", cache,
                             "--engine-url", url], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    page = f"http://127.0.0.1:{port}/"
    try:
        while (h := _health(page)).get("state") != "ready":
            time.sleep(0.5)
        me = psutil.Process(proc.pid)
        rss = me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))
        return {"page_rss_mb": rss >> 20, "plan_total_mb": h["memory"]["plan"]["total_mb"]}
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def timed_requests(services: dict, repeats: int) -> dict:
    """{name: {short_ms, long_ms, eight_short_at_once_ms}} for each service, their requests interleaved
    (remote, in-process, remote, ...) so that a load that comes and goes weighs on both alike."""
    from lensapp.service import LensRequest

    def one(service, prompt: str) -> float:
        t = time.perf_counter()
        service.lens(LensRequest(prompts=(prompt,), k=5))
        return time.perf_counter() - t

    def eight(service) -> float:
        with ThreadPoolExecutor(8) as pool:
            t = time.perf_counter()
            list(pool.map(lambda _: one(service, SHORT), range(8)))
            return time.perf_counter() - t

    prompts = {"short": SHORT, "long": LONG_PARAGRAPH * 5}
    times: dict = {name: {key: [] for key in (*prompts, "eight")} for name in services}
    for service in services.values():          # untimed: the first of each size
        for prompt in prompts.values():
            one(service, prompt)
    for i in range(repeats):
        order = list(services.items())
        for name, service in order if i % 2 == 0 else order[::-1]:
            for key, prompt in prompts.items():
                times[name][key].append(one(service, prompt))
            times[name]["eight"].append(eight(service))
    out = {}
    for name, t in times.items():
        for key, v in t.items():
            label = "eight_short_at_once" if key == "eight" else key
            out.setdefault(name, {})[f"{label}_ms"] = round(1000 * statistics.median(v), 1)
            out[name][f"{label}_min_ms"] = round(1000 * min(v), 1)       # the least disturbed by other load
    return out


def measure_serialization() -> dict:
    """Wrap served.serialize to time it and weigh what it sends (client side, in this process)."""
    from lensapp.engine import served

    real, seen = served.serialize, []

    def timing(tracer):
        t = time.perf_counter()
        blob = real(tracer)
        seen.append((time.perf_counter() - t, len(blob)))
        return blob

    served.serialize = timing
    return {"seen": seen}


def service(**settings):
    from lensapp.service import LensService

    s = LensService.start(config.Config.of(cache_entries=0, **settings))
    s.wait_ready(900)
    return s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="requests per prompt size")
    parser.add_argument("--starts", type=int, default=2, help="page starts of each kind (0: none)")
    args = parser.parse_args(argv)
    config.prepare_process_environment()
    cache = str(config.resolve_cache_dir(config.EngineSettings()))
    results: dict = {"bench": "engine_service"}

    results["start_in_process"] = [one_start(cache) for _ in range(args.starts)]
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc, engine_s = start_engine(port, Path(tmp) / "engine.log")
        results["engine_ready_s"] = round(engine_s, 1)
        url = f"http://127.0.0.1:{port}"
        try:
            results["start_remote"] = [one_start(cache, ["--engine-url", url])
                                       for _ in range(args.starts)]
            results.update(page_memory(cache, url))
            sizes = measure_serialization()
            remote = service(engine_url=url, engine_key=KEY)
            local = service()                  # idle while the other one answers
            sizes["seen"].clear()
            results.update(timed_requests({"remote": remote, "in_process": local}, args.repeats))
            results["tokens"] = {name: len(local.prompts.ids(p)) for name, p in (("short", SHORT),
                                                                                 ("long", LONG_PARAGRAPH * 5))}
            seen = sizes["seen"]
            results["serialize_ms_median"] = round(1000 * statistics.median(s for s, _ in seen), 2)
            results["trace_bytes_median"] = int(statistics.median(n for _, n in seen))
            remote.close()
            local.close()
        finally:
            stop(proc)
    report(results)
    return 0


def report(r: dict) -> None:
    for kind in ("start_in_process", "start_remote"):
        for s in r[kind]:
            print(f"{kind:>16}: page {s['page_s']:5.1f} s, app {s['app_s']:5.1f} s, ready {s['ready_s']:5.1f} s, "
                  f"first readout {s['readout_s']:5.1f} s")
    print(f"engine service ready in {r['engine_ready_s']} s; a page on it holds {r['page_rss_mb']} MB "
          f"(its plan: {r['plan_total_mb']} MB)")
    print(f"{'':>24}{'in-process':>12}{'remote':>12}{'wire':>10}")
    for key in ("short_ms", "short_min_ms", "long_ms", "long_min_ms", "eight_short_at_once_ms",
                "eight_short_at_once_min_ms"):
        a, b = r["in_process"][key], r["remote"][key]
        print(f"{key:>24}{a:>12.1f}{b:>12.1f}{b - a:>+10.1f}")
    print(f"tokens {r['tokens']}; a trace serializes in {r['serialize_ms_median']} ms to "
          f"{r['trace_bytes_median']} bytes")
    print(json.dumps(r))


if __name__ == "__main__":
    raise SystemExit(main())
