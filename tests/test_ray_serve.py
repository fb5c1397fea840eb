"""`lensapp engine --replicas 2` (ray_serve.py): the engine service as a Ray Serve deployment of two CPU replicas on
a local Ray, a page on Serve's proxy (`--engine-url`): the in-process readouts, and one replica's vLLM engine
killed under load, replaced by Serve (check_health) while the other answers; (extended) a replica's own process
killed under load, replaced by Ray. About 250 s here (the in-process reference's start included, ~50 s of it;
each replacement is a new engine's start, ~60 s; the extended test ~95 s more).

One deployment for the module, in its own process (the command a host runs); the in-process reference is the
session's `vllm_service` with the same random lens (test_engine_service.py's fixtures). At the end the command
is stopped with SIGTERM and nothing of its Ray is left. The figures (replica start, memory per replica, what
the page saw of the kill, the replacement's time) are printed (`pytest -s`)."""

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import psutil
import pytest
import test_engine_service
from conftest import CACHE, REPO, _free_port
from test_engine_service import GENERATE, KEY, LENS, assert_same_json, assert_same_lens

from lensapp.service import LensRequest

pytestmark = pytest.mark.engine

lens_file = test_engine_service.lens_file          # the module's random lens, and the in-process service with it
reference = test_engine_service.reference

REPLICAS = 2
START_S = 900
LOAD_CLIENTS = 4
ONE_READOUT = LensRequest(prompts=("The capital of France is",), lens="logit", k=5)


# Settings of a page, which the engine's memory check counts (engine/start/memory.py) though a replica holds
# none of them: off, so that three engines (two replicas and the reference) pass it on a busy machine.
NO_PAGE = {"LENSAPP_MAX_FIT_STEPS": "0", "LENSAPP_CACHE_ENTRIES": "0", "LENSAPP_SESSION_MB": "8"}
# Ray's memory monitor kills Ray's own workers (replicas, and Serve's controller) when the machine's memory, other
# programs' included, passes 95%: on a shared test machine that is not this test's doing.
NO_RAY_OOM_KILLER = {"RAY_memory_monitor_refresh_ms": "0"}


def start_replicas(port: int, lens_file, log_path) -> subprocess.Popen:
    """`lensapp engine --replicas 2` in its own process group, as test_engine_service.start_engine starts one."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"} | NO_PAGE | NO_RAY_OOM_KILLER | {
        "LENSAPP_ENGINE_KEY": KEY, "RAY_DEDUP_LOGS": "0"}
    return subprocess.Popen([sys.executable, "-m", "lensapp", "engine", "--port", str(port), "--replicas",
                             str(REPLICAS), "--replica-cpus", "1", "--jlens", str(lens_file), "--max-batch", "8",
                             "--cache-dir", str(CACHE)],
                            cwd=REPO, env=env, stdout=open(log_path, "a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def replicas_ready(log) -> int:
    return log.read_text().count("engine replica ready in")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, lens_file, embedded_dir):
    port = _free_port()
    log = tmp_path_factory.mktemp("ray-serve") / "engine.log"
    log.touch()
    t = time.monotonic()
    proc = start_replicas(port, lens_file, log)
    deadline = t + START_S
    while "engine ready on" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"lensapp engine --replicas did not start:\n{log.read_text()[-4000:]}")
        time.sleep(1)
    print(f"\n{REPLICAS} replicas on Ray Serve ready in {time.monotonic() - t:.0f} s (Ray included)")
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    ours = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=180)
    _, left = psutil.wait_procs(ours, timeout=60)
    for p in left:
        p.kill()
    assert proc.returncode == 0 and not left, f"left behind: {[p.pid for p in left]}\n{log.read_text()[-3000:]}"


@pytest.fixture(scope="module")
def page(deployment, lens_file):
    """A page's service in this process on Serve's proxy: one URL for both replicas."""
    from lensapp import config
    from lensapp.service import LensService

    service = LensService.start(config.Config.of(engine_url=deployment.url, engine_key=KEY, jlens=str(lens_file),
                                              cache_entries=0, cache_dir=str(CACHE)))
    service.wait_ready(300)
    yield service
    service.close()


def title(p: psutil.Process) -> str:
    """What `ps` shows: Ray and vLLM name their processes (setproctitle), and /proc's name is cut at 15 bytes."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def replica_processes(deployment) -> dict[int, list[psutil.Process]]:
    """{replica actor's pid: its vLLM processes}, for the replicas up now."""
    return {p.pid: p.children(recursive=True) for p in psutil.Process(deployment.proc.pid).children(recursive=True)
            if "ServeReplica:lensapp-engine" in title(p)}


def rss_mb(procs) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2 ** 20


def test_a_page_on_serve_reads_as_in_process(deployment, page, reference):
    assert page.health()["backend"] == "vllm-serve"
    for a, b in zip(page.lens(LENS), reference.lens(LENS)):
        assert set(b.lenses) == {"logit", "jacobian"}
        assert_same_lens(a, b)
    a, b = page.generate(GENERATE), reference.generate(GENERATE)
    assert a.token_ids == b.token_ids
    assert_same_json(a.to_json(), b.to_json())
    replicas = replica_processes(deployment)
    assert len(replicas) == REPLICAS
    for pid, engine in replicas.items():
        print(f"replica {pid}: {rss_mb([psutil.Process(pid)]):.0f} MB, its vLLM processes "
              f"({', '.join(title(p).split()[0] for p in engine)}) {rss_mb(engine):.0f} MB")


def kill_under_load(deployment, page, want, victim: psutil.Process, what: str) -> None:
    """kill -9 of `victim` while LOAD_CLIENTS clients read `ONE_READOUT`, until Serve has a new replica serving.
    Nothing is lost (the page's pool, engine/run/engines.py, asks a trace that lost its replica again, once the
    proxy's address answers again), the victim's processes are gone; what the page saw is printed."""
    orphans = victim.children(recursive=True)
    ready_before = replicas_ready(deployment.log)
    stop, done, lost = threading.Event(), [], []

    def client():
        while not stop.is_set():
            t = time.monotonic()
            try:
                got = page.lens(ONE_READOUT)[0]
            except Exception as e:  # noqa: BLE001 - what the page saw is the measurement
                lost.append(f"{type(e).__name__}: {e}")
                continue
            done.append((t, time.monotonic()))
            assert_same_lens(got, want)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(LOAD_CLIENTS)]
    for c in clients:
        c.start()
    time.sleep(3)                                   # readouts in flight on both replicas
    killed = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    deadline = killed + START_S
    while replicas_ready(deployment.log) <= ready_before:
        assert time.monotonic() < deadline, deployment.log.read_text()[-3000:]
        time.sleep(0.5)
    replaced = time.monotonic() - killed
    time.sleep(5)                                   # the new replica in the proxy's routing, and answering
    stop.set()
    for c in clients:
        c.join(timeout=300)
    waits = [t1 - t0 for t0, t1 in done if t1 > killed]
    print(f"\nkill -9 of {what} under {LOAD_CLIENTS} clients: {len(done)} readouts answered, {len(lost)} lost; "
          f"longest wait after the kill {max(waits, default=0):.1f} s; the replica replaced and serving "
          f"{replaced:.0f} s after the kill; the page's engines: {page_engines(page)}")
    assert not lost, lost
    assert page.engine.health()["restarts"] == 0          # the page's engine was never taken for gone
    _, left = psutil.wait_procs(orphans, timeout=30)
    assert not left, f"the killed {what}'s processes outlived it: {[title(p) for p in left]}"
    assert len(replica_processes(deployment)) == REPLICAS and deployment.proc.poll() is None
    assert victim.pid not in {p.pid for procs in replica_processes(deployment).values() for p in procs}
    assert_same_lens(page.lens(ONE_READOUT)[0], want)


def test_a_replica_whose_engine_is_killed_under_load_is_replaced_and_the_page_loses_nothing(deployment, page,
                                                                                           reference):
    """kill -9 of one replica's vLLM EngineCore: Serve's check_health fails, the replica is replaced. A readout
    that met the dead engine (an answer naming EngineDeadError) is asked again by the page's pool once the proxy
    answers again (the other replica), and no request the page had in flight is told to run again."""
    replicas = replica_processes(deployment)
    victim = next(p for p in next(iter(replicas.values())) if title(p).startswith("VLLM::EngineCore"))
    kill_under_load(deployment, page, reference.lens(ONE_READOUT)[0], victim, "a replica's vLLM EngineCore")


@pytest.mark.extended
def test_a_replica_process_killed_under_load_is_replaced_and_the_page_loses_nothing(deployment, page, reference):
    """kill -9 of a replica's own process (the Ray actor; its vLLM processes go with it): Ray replaces it."""
    victim = psutil.Process(next(iter(replica_processes(deployment))))
    kill_under_load(deployment, page, reference.lens(ONE_READOUT)[0], victim, "a replica's process (the Ray actor)")


def page_engines(page) -> list:
    """What the page's /health says of its engines (engines.Engines.describe)."""
    return page.engine.health().get("engines", [])
