"""The Dockerfile, built for real and run as a Space runs it (bench/image.py does both; this checks what it says).

Debian's podman builds the CPU image from this checkout on a Debian bookworm base made with debootstrap (no
container registry is needed), then runs it with a 4 GB memory limit, a 64 MB /dev/shm and uid 1000, waits for
/health to say ready and reads a lens through the API. The build takes several minutes of two cores and fetches
Debian packages and PyPI wheels, so it is `extended` (and `network`); it needs root, podman and runc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lensapp import space

ROOT = Path(__file__).resolve().parents[1]
TAG = "localhost/lens-explorer:test"

pytestmark = [pytest.mark.slow, pytest.mark.extended, pytest.mark.network]


@pytest.fixture(scope="module")
def podman():
    missing = [tool for tool in ("podman", "runc", "debootstrap") if not shutil.which(tool)]
    if missing or os.geteuid() != 0:
        pytest.skip(f"needs root and podman, runc, debootstrap (missing: {missing or 'root'}): "
                    "apt-get install podman runc debootstrap")


@pytest.fixture(scope="module")
def measured(podman):
    """bench/image.py --build: the image built from this checkout, run, measured; its JSON line."""
    out = subprocess.run([sys.executable, "bench/image.py", "--build", "--tag", TAG], cwd=ROOT, capture_output=True,
                         text=True, timeout=3600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    print(out.stdout)                                     # the bench's table (pytest -s shows it)
    return json.loads(out.stdout.splitlines()[-1])


def test_the_image_serves_a_lens_in_4_gb_with_a_64_mb_dev_shm_as_uid_1000(measured):
    assert measured["next_token"] == " Paris"
    assert measured["uid"] == "1000"
    assert measured["memory_limit_bytes"] == 4 * 2**30 and measured["limit_seen_mb"] == 4096   # the app planned in it
    assert 60 * 1024 <= measured["shm_kib"] <= 64 * 1024
    assert measured["plan_mb"] <= measured["limit_seen_mb"] and measured["oom_killed"] is False
    assert measured["peak_bytes"] is None or measured["peak_bytes"] < 4 * 2**30


def test_the_image_holds_the_files_a_space_gets(measured):
    """What `lensapp space push` uploads is what the build copied: tracked files less .dockerignore's (plus any
    untracked file a local build also sees); nothing else but what the build made (.venv, egg-info, caches)."""
    listing = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--ulimit", "nofile=1024:1024",
                              "--ulimit", "nproc=1024:1024", "--entrypoint", "find", TAG, ".", "-type", "f"],
                             capture_output=True, text=True, check=True, timeout=300).stdout
    made = ("./.venv/", "./lens_explorer.egg-info/")
    in_image = {p.removeprefix("./") for p in listing.splitlines() if not p.startswith(made) and "__pycache__" not in p}
    planned = {f.path for f in space.plan("someone/x").files}
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split()
    extra = {p for p in untracked if not space.ignored(p, space.dockerignore_patterns())}
    assert planned <= in_image and in_image - planned <= extra, (sorted(planned - in_image), sorted(in_image - planned))
