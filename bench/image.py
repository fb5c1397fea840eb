"""The CPU image, built and run as a Space runs it: a 4 GB memory limit, a 64 MB /dev/shm, uid 1000.

Builds the Dockerfile from this checkout with podman (`--build`), starts a container from it and measures,
from `podman run`: the first page (HTTP 200 on `/`), `/health` saying `ready`, and the first `/lens` readout
answered (gradio_client, from this process). Then what the container was given and used: its uid, its memory
limit and peak (the container's memory cgroup), its /dev/shm, and the image's size.

No container registry is needed. The base is Debian bookworm made with debootstrap (`--variant=minbase`,
imported as localhost/debian-bw:bookworm; made here when missing), passed as the Dockerfile's BASE. torch's
CPU wheel, which only PyTorch's index serves, comes from pip's own find-links on this host when they hold it,
and pip's CA bundle with it (a proxy that re-signs TLS): both through the `pip-local` build context.

    python bench/image.py --build          # build, run, measure (root; podman, runc, debootstrap)
    python bench/image.py                  # run and measure the image built before

podman runs with runc (crun refuses a host with hybrid cgroups, as this project's machines have) and with
nofile/nproc limits of 1024 (podman's defaults ask for more than such a host allows a container).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAG = "localhost/lens-explorer:cpu"
BASE = "localhost/debian-bw:bookworm"
PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
MEMORY, SHM, UID = "4g", "64m", "1000"
TOKEN_VAR = "LENSAPP_HEALTH_TOKEN"     # /health's full figures for whoever sends it (lensapp/settings.py Secrets)
PROMPT = "The capital of France is"


def ensure_base(name: str = BASE) -> None:
    """Debian bookworm's minbase as a local image, from Debian's own mirror (deb.debian.org)."""
    if subprocess.run([*PODMAN, "image", "exists", name]).returncode == 0:
        return
    with tempfile.TemporaryDirectory(prefix="debian-bw-") as root:
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", root, "http://deb.debian.org/debian"],
                       check=True, stdout=subprocess.DEVNULL)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run([*PODMAN, "import", "-", name], stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)
        tar.wait()


def pip_settings() -> dict[str, list[str]]:
    """pip's own find-links and cert on this host (`pip config list`, files and PIP_* variables)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {"find-links": [], "cert": []}
    for key, value in re.findall(r"^\S*?\.?(find-links|cert)='(.*)'$", out, re.M):
        found[key] += value.split()
    return found


def pip_local(folder: Path) -> list[str]:
    """Fill `folder` for the build's pip-local context; the build arguments that use it ([] when empty)."""
    pin = re.search(r'"(torch==[^"]+\+cpu)"', (REPO / "pyproject.toml").read_text()).group(1).split("==")[1]
    settings = pip_settings()
    wheels = [w for d in settings["find-links"] for w in Path(d.removeprefix("file://")).glob(f"torch-{pin}-*.whl")]
    certs = [Path(c) for c in settings["cert"] if Path(c).is_file()]
    folder.chmod(0o755)                  # the build's pip runs as the image's user (uid 1000)
    if wheels:
        try:
            os.link(wheels[0], folder / wheels[0].name)
        except OSError:
            shutil.copy(wheels[0], folder / wheels[0].name)
    if certs:
        shutil.copy(certs[0], folder / "ca.crt")
        (folder / "ca.crt").chmod(0o644)
    if not wheels and not certs:
        return []
    return ["--build-context", f"pip-local={folder}"] + (["--build-arg", "TORCH_INDEX="] if wheels else [])


def build(tag: str = TAG, base: str = BASE, log: Path | None = None) -> float:
    """Build the CPU image; its seconds. Raises with the log's tail when the build fails."""
    ensure_base(base)
    log = log or Path(tempfile.gettempdir()) / "lens-explorer-image-build.log"
    with tempfile.TemporaryDirectory(prefix="pip-local-") as folder:
        # VARIANT given explicitly: podman 4.3's buildah finds a stage named by an ARG only when the ARG is passed.
        cmd = [*PODMAN, "build", *LIMITS, "--build-arg", "VARIANT=cpu", "--build-arg", f"BASE={base}",
               *pip_local(Path(folder)), "-t", tag, str(REPO)]
        t0 = time.perf_counter()
        with open(log, "w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if done.returncode:
            raise RuntimeError(f"podman build failed ({done.returncode}); {log}:\n" + log.read_text()[-3000:])
    return time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str, token: str = "") -> dict:
    """/health as everyone sees it, or with the container's health token as its host does (the bench's requests
    reach the container through its published port, not from its loopback: without the token they get the public
    part only, which has no `memory`)."""
    request = urllib.request.Request(url + "health", headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:           # 503 while starting, restarting or down: the body is the health
        return json.loads(e.read())
    except (OSError, ValueError):
        return {"state": "unreachable"}


def podman_out(*args: str) -> str:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=True).stdout.strip()


def peak_memory(name: str) -> int | None:
    """The container's memory cgroup's peak charge in bytes (cgroup v1 or v2), None where it cannot be read."""
    path = podman_out("inspect", "--format", "{{.State.CgroupPath}}", name).lstrip("/")
    for file in (Path("/sys/fs/cgroup/memory") / path / "memory.max_usage_in_bytes",
                 Path("/sys/fs/cgroup") / path / "memory.peak"):
        if file.is_file():
            return int(file.read_text())
    return None


def run_and_measure(tag: str = TAG, timeout: float = 900) -> dict:
    """Start the image as a Space would (4 GB, 64 MB /dev/shm, uid 1000, loopback only), read a lens, stop it."""
    port, name = free_port(), f"lens-explorer-bench-{os.getpid()}"
    url, token = f"http://127.0.0.1:{port}/", secrets.token_urlsafe(32)
    out: dict = {"image": tag, "image_bytes": int(podman_out("image", "inspect", "--format", "{{.Size}}", tag))}
    t0 = time.perf_counter()
    # `-e NAME` without a value: podman passes the variable from its own environment, so the token is never on
    # an argv (`ps` shows those to everyone on this machine).
    subprocess.run([*PODMAN, "run", "-d", "--name", name, "--memory", MEMORY, "--memory-swap", MEMORY,
                    "--shm-size", SHM, "--user", UID, *LIMITS, "-p", f"127.0.0.1:{port}:7860",
                    "-e", TOKEN_VAR, tag],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, TOKEN_VAR: token})
    try:
        while "page_s" not in out:
            _alive(name, t0, timeout)
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    out["page_s"] = time.perf_counter() - t0 if r.status == 200 else None
            except OSError:
                time.sleep(0.2)
        while (state := health(url).get("state")) != "ready":
            if state == "down":                   # the reason is the host's: asked with the token
                raise RuntimeError(f"the app is down: {health(url, token).get('reason')}\n{_logs(name)}")
            _alive(name, t0, timeout)
            time.sleep(0.5)
        out["ready_s"] = time.perf_counter() - t0
        from gradio_client import Client

        lens = Client(url, verbose=False).predict(PROMPT, "logit", "all", 5, "Paris", api_name="/lens")
        out["first_lens_s"] = time.perf_counter() - t0
        out["next_token"] = lens["model_next_token"]
        h = health(url, token)
        if "memory" not in h:
            raise RuntimeError(f"/health did not take the health token ({TOKEN_VAR}): it gave {sorted(h)}")
        plan = h["memory"]["plan"] or {}
        out["plan_parts_mb"] = {k: v for k, v in plan.items()
                                if k.endswith("_mb") and k not in ("total_mb", "limit_mb")}
        out["plan_mb"], out["limit_seen_mb"] = plan.get("total_mb"), plan.get("limit_mb")   # the app's own view
        out["uid"] = podman_out("exec", name, "id", "-u")
        out["shm_kib"] = int(podman_out("exec", name, "df", "-k", "/dev/shm").splitlines()[-1].split()[1])
        out["memory_limit_bytes"] = int(podman_out("inspect", "--format", "{{.HostConfig.Memory}}", name))
        out["peak_bytes"] = peak_memory(name)
        out["oom_killed"] = podman_out("inspect", "--format", "{{.State.OOMKilled}}", name) == "true"
    finally:
        subprocess.run([*PODMAN, "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def _alive(name: str, t0: float, timeout: float) -> None:
    if time.perf_counter() - t0 > timeout:
        raise RuntimeError(f"not ready after {timeout:.0f} s\n{_logs(name)}")
    if podman_out("inspect", "--format", "{{.State.Running}}", name) != "true":
        raise RuntimeError(f"the container exited\n{_logs(name)}")


def _logs(name: str) -> str:
    done = subprocess.run([*PODMAN, "logs", "--tail", "40", name], capture_output=True, text=True)
    return done.stdout + done.stderr


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="build the image from this checkout first")
    parser.add_argument("--tag", default=TAG, help="the image to build and run")
    args = parser.parse_args(argv)
    results = {"build_s": round(build(args.tag), 1)} if args.build else {}
    results |= run_and_measure(args.tag)
    gib = 2**30
    print(f"image {results['image']}: {results['image_bytes'] / 1e9:.2f} GB" +
          (f", built in {results['build_s']:.0f} s" if "build_s" in results else ""))
    print(f"container (memory {MEMORY}, /dev/shm {results['shm_kib'] // 1024} MB, uid {results['uid']}): "
          f"page {results['page_s']} s, /health ready {results['ready_s']} s, first /lens {results['first_lens_s']} s "
          f"(next token {results['next_token']!r})")
    peak = f"{results['peak_bytes'] / gib:.2f} GiB" if results["peak_bytes"] else "unreadable"
    print(f"memory: limit {results['memory_limit_bytes'] / gib:.0f} GiB (the app sees {results['limit_seen_mb']} MB), "
          f"plan {results['plan_mb']} MB, peak {peak}, OOM killed: {results['oom_killed']}")
    print("plan: " + " + ".join(f"{k.removesuffix('_mb').replace('_', ' ')} {v}" for k, v in
                                results["plan_parts_mb"].items()) + f" = {results['plan_mb']} MB")
    print(json.dumps({"bench": "image", **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
