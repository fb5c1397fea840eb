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
REASKS = 3                      # a readout told "the model restarted; please run again" is asked again, so often


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


def run_again(error: Exception) -> bool:
    """The page's own word for a request to ask again: its supervisor restarted the engine under it."""
    from lensapp.engine import EngineRestarted

    return isinstance(error, EngineRestarted)


def kill_under_load(deployment, page, want, victim: psutil.Process, what: str, reask=run_again) -> None:
    """kill -9 of `victim` while LOAD_CLIENTS clients read `ONE_READOUT` (each asked again, up to REASKS times,
    after an error `reask` takes, as a page's fail-over asks again); until Serve has a new replica serving.
    Nothing is lost, the victim's processes are gone; what the page saw is printed."""
    orphans = victim.children(recursive=True)
    ready_before = replicas_ready(deployment.log)
    stop, done, told, lost = threading.Event(), [], [], []

    def client():
        while not stop.is_set():
            t = time.monotonic()
            for _ in range(1 + REASKS):
                try:
                    got = page.lens(ONE_READOUT)[0]
                except Exception as e:  # noqa: BLE001 - what the page saw is the measurement
                    if reask(e):
                        told.append((t, time.monotonic(), f"{type(e).__name__}: {e}"))
                        continue
                    lost.append(f"{type(e).__name__}: {e}")
                    break
                done.append((t, time.monotonic()))
                assert_same_lens(got, want)
                break
            else:
                lost.append(f"still 'run again' after {REASKS} re-asks")

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
    print(f"\nkill -9 of {what} under {LOAD_CLIENTS} clients: {len(done)} readouts answered, {len(told)} asked again "
          f"({', '.join(f'{t1 - killed:.1f}' for _, t1, _ in told)} s after the kill: "
          f"{sorted({error for *_, error in told})}), {len(lost)} lost; longest wait after the kill (re-asks "
          f"included) {max(waits, default=0):.1f} s; the replica replaced and serving {replaced:.0f} s after the kill")
    assert not lost, lost
    _, left = psutil.wait_procs(orphans, timeout=30)
    assert not left, f"the killed {what}'s processes outlived it: {[title(p) for p in left]}"
    assert len(replica_processes(deployment)) == REPLICAS and deployment.proc.poll() is None
    assert victim.pid not in {p.pid for procs in replica_processes(deployment).values() for p in procs}
    assert_same_lens(page.lens(ONE_READOUT)[0], want)


def test_a_replica_whose_engine_is_killed_under_load_is_replaced_and_the_page_loses_nothing(deployment, page,
                                                                                           reference):
    """kill -9 of one replica's vLLM EngineCore: Serve's check_health fails, the replica is replaced. A readout
    that met the dead engine comes back "the model restarted; please run again" (the page's supervisor takes an
    answer naming EngineDeadError for its engine's death, and tells every request it had in flight to run
    again); asked again, it is answered."""
    replicas = replica_processes(deployment)
    victim = next(p for p in next(iter(replicas.values())) if title(p).startswith("VLLM::EngineCore"))
    kill_under_load(deployment, page, reference.lens(ONE_READOUT)[0], victim, "a replica's vLLM EngineCore")


def serve_lost_a_replica(error: Exception) -> bool:
    """Serve's proxy answers 500 ("Internal Server Error") for each request in flight on a replica whose process
    died (ray/serve/_private/http_util.py: a RayActorError is a 500); the page raises StartFailed naming it.
    Through Serve, nnsight-serve's own answers to a trace are 200 (a trace's error comes back inside), so a 500
    is the replica's death: a page's fail-over asks it again."""
    from lensapp.engine.run.protocol import StartFailed

    return isinstance(error, StartFailed) and "returned 500" in str(error)


@pytest.mark.extended
def test_a_replica_process_killed_under_load_is_replaced_and_the_page_loses_nothing(deployment, page, reference):
    """kill -9 of a replica's own process (the Ray actor; its vLLM processes go with it): Ray replaces it."""
    victim = psutil.Process(next(iter(replica_processes(deployment))))
    kill_under_load(deployment, page, reference.lens(ONE_READOUT)[0], victim, "a replica's process (the Ray actor)",
                    serve_lost_a_replica)
