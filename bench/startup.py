"""From `lensapp serve` to a served readout: cold (first ever: the embedded model converted) and warm starts.

For each start it measures, from the process's start: the first page (HTTP 200 on `/`: the plain "starting"
page `shell.py` answers before Gradio, torch, vLLM and nnsight are imported), the real app (its `/health`
names the model), /health reporting `ready`, and the first /lens readout answered. It also times
`python -c "import gradio"` on the same machine, the yardstick for the first page. A cold start uses a fresh
cache folder; a warm one the folder the cold start filled. Goals (issue 21): the first page within 1.5x the
time `import gradio` takes, and the first readout within 30 s where it used to take 27-30 s.

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


def one_start(cache_dir: str, extra: list[str] | tuple = ()) -> dict:
    """One `lensapp serve` (with `extra` flags, e.g. --engine-url) from its start to its first readout."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lensapp", "serve", "--port", str(port), "--cache-dir", cache_dir,
                             *extra],
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
                time.sleep(0.05)
        while "model" not in _health(url):              # the starting page's /health names no model
            time.sleep(0.1)
        out["app_s"] = time.perf_counter() - t0
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
    import urllib.error

    try:
        with urllib.request.urlopen(url + "health", timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:           # 503 while restarting or down: the body is the health
        return json.loads(e.read())
    except OSError:
        return {"state": "unknown"}


def import_gradio_s(repeats: int) -> float:
    """The best of `repeats` fresh `python -c "import gradio"` (the page's yardstick)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import gradio"], check=True, env={**os.environ,
                       "GRADIO_ANALYTICS_ENABLED": "False"})
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-only", action="store_true", help="skip the cold start (reuse the user cache dir)")
    parser.add_argument("--repeats", type=int, default=2, help="warm starts")
    args = parser.parse_args(argv)
    results = {"import_gradio_s": round(import_gradio_s(args.repeats), 1)}
    with tempfile.TemporaryDirectory(prefix="lensapp-cold-") as fresh:
        cache = fresh
        if args.warm_only:
            from lensapp import config

            cache = str(config.resolve_cache_dir(config.EngineSettings()))
        else:
            results["cold"] = one_start(cache)
        results["warm"] = [one_start(cache) for _ in range(args.repeats)]
    gradio_s = results["import_gradio_s"]
    print(f"import gradio: {gradio_s:5.1f} s")
    runs = ([("cold", results["cold"])] if "cold" in results else []) + [("warm", r) for r in results["warm"]]
    for name, r in runs:
        r["page_over_import_gradio"] = round(r["page_s"] / gradio_s, 2)
        print(f"{name:>5}: page {r['page_s']:5.1f} s ({r['page_over_import_gradio']:.2f}x import gradio, engine "
              f"{r['state_at_page']}), real app {r['app_s']:5.1f} s, ready {r['ready_s']:5.1f} s, "
              f"first readout {r['readout_s']:5.1f} s")
    print(json.dumps({"bench": "startup", **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
