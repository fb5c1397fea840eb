"""Take the README's picture: the first view a visitor lands on, from the embedded model and the shipped lens.

    python scripts/readme_picture.py [--out docs/images/jacobian-tab.png] [--width 1400] [--height 1560]

Starts `python app.py` with its defaults on a free loopback port, opens it in Debian's Chromium (Playwright, as
the browser tests do), waits for the Jacobian tab's chart and saves the top of the page. Retake it whenever the
shipped lens or the first view changes: the README's caption describes what this picture shows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
START_SECONDS = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, app: subprocess.Popen) -> None:
    """Until /health says the model serves and the first view is computed (the port answers long before)."""
    deadline = time.time() + START_SECONDS
    while time.time() < deadline:
        if app.poll() is not None:
            sys.exit(f"app.py exited with {app.returncode}")
        try:
            with urllib.request.urlopen(url + "health", timeout=5) as r:
                health = json.loads(r.read())
        except urllib.error.HTTPError as e:                  # 503 while starting; the body says which state
            health = json.loads(e.read())
        except OSError:
            health = {}
        if health.get("state") == "ready" and health.get("front_page") == "ready":   # the first view computed
            return
        if health.get("state") == "down":
            sys.exit(f"the app says the model is down: {health.get('reason')}")
        time.sleep(2)
    sys.exit(f"the app did not serve within {START_SECONDS} s")


def take(url: str, out: Path, width: int, height: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(url)
        page.wait_for_selector("#jacobian-heatmap svg.marks g.role-mark path", timeout=180_000)
        page.wait_for_timeout(1000)                          # the chart's fade-in
        page.screenshot(path=str(out))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "jacobian-tab.png")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1560)
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    app = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_serving(url, app)
        take(url, args.out, args.width, args.height)
        print(f"wrote {args.out}")
    finally:
        app.send_signal(signal.SIGTERM)
        app.wait(timeout=90)


if __name__ == "__main__":
    main()
