"""From `lensapp serve` to a served readout: cold (first ever: the embedded model converted) and warm starts.

For each start it measures: the page answering HTTP 200 (it does before the engine is ready, saying so),
/health reporting `ready`, and the first /lens readout answered. A cold start uses a fresh cache folder;
a warm one the folder the cold start filled. Goal: a warm start serves a readout within 45 s.

    python bench/startup.py [--warm-only] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))             # `--warm-only` reads the app's own settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(cache_dir: str) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lensapp", "serve", "--port", str(port), "--cache-dir", cache_dir],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    out = {}
    try:
        while "page_s" not in out:
            if proc.poll() is not None:
                raise SystemExit(f"the app exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        out["page_s"] = time.perf_counter() - t0
                        out["state_at_page"] = _health(url)["state"]
            except OSError:
                time.sleep(0.2)
        while _health(url)["state"] != "ready":
            time.sleep(0.5)
        out["ready_s"] = time.perf_counter() - t0
        from gradio_client import Client

        Client(url, verbose=False).predict("The capital of France is", "logit", "all", 5, "", api_name="/lens")
        out["readout_s"] = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def _health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "health", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return {"state": "unknown"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-only", action="store_true", help="skip the cold start (reuse the user cache dir)")
    parser.add_argument("--repeats", type=int, default=2, help="warm starts")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="lensapp-cold-") as fresh:
        cache = fresh
        if args.warm_only:
            from lensapp import config

            cache = str(config.Config().resolved_cache_dir)
        else:
            results["cold"] = one_start(cache)
        results["warm"] = [one_start(cache) for _ in range(args.repeats)]
    for name, runs in results.items():
        for r in runs if isinstance(runs, list) else [runs]:
            print(f"{name:>5}: page {r['page_s']:5.1f} s (engine {r['state_at_page']}), ready {r['ready_s']:5.1f} s, "
                  f"first readout {r['readout_s']:5.1f} s")
    print(json.dumps({"bench": "startup", **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
