"""`lensapp engine --replicas N`: the engine service as a Ray Serve deployment, N copies behind one address.

Each replica is a Ray actor holding what `lensapp engine` holds (engine_service.py: vLLM on the model with its
own executor, the Jacobian lens, the warm-up, nnsight-serve's app behind our key check) and serves that app
through Serve's HTTP proxy (`@serve.ingress`, the app built at replica start by `__serve_build_asgi_app__`).
A page points `--engine-url` at the proxy as at one service. What Ray Serve adds:

- routing: each request goes to a replica with room (Serve's power-of-two-choices on requests in flight);
- backpressure: a replica holds at most `--max-batch` requests (`max_ongoing_requests`, what its engine runs
  at once); past that the proxy queues up to `--max-queued`, and answers one more 429 at once, so a page with
  other engines asks elsewhere;
- health: `check_health` (every 2 s) raises once the replica's vLLM engine has died, and Serve replaces the replica (as
  for one whose actor died); the proxy sends nothing to a replica while it starts (its engine's start, warm-up
  included, runs in the replica's constructor);
- placement: `--replica-cpus` / `--replica-gpus` per replica, on one machine or a Ray cluster (`--ray-address`).

What it does not know: the Jacobian lens a page installs reaches one replica; so give the service its lens
(`--jlens`), which every replica installs at start. The key never travels through Ray (its arguments show in
Ray's dashboard): each replica reads it from its own environment or `--engine-key-file`, as `lensapp engine`
does. On a Ray cluster, every node's `ray start` runs with LENSAPP_ENGINE_KEY set, or the key file at the same
path on every node.

    lensapp engine --replicas 2 --port 6677                        # a local Ray, two replicas, one address
    ray start --head && lensapp engine --replicas 4 --replica-gpus 1 --ray-address auto --host 0.0.0.0
    serve run lensapp.ray_serve:build_app replicas=2 jlens=lens.pt # Serve's own CLI (a config file: docs/hosting.md)
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
import time

from ray import serve

from . import config
from .engine_service import add_engine_arguments, checked_config, served_app, start_engine

APP_NAME = "lensapp-engine"
QUEUED_BATCHES = 4               # --max-queued's default: this many engine batches per replica wait at the proxy
# Between two of Serve's check_health calls on a replica: Serve stops one after 3 failures in a row, and until
# then routes requests to it, each answered at once with vLLM's EngineDeadError (as `lensapp engine` watches).
HEALTH_PERIOD_S = 2.0
HEALTH_TIMEOUT_S = 30.0          # a check_health that takes longer counts as failed
REPLICA_OPTIONS = ("replicas", "replica_cpus", "replica_gpus", "max_queued", "ray_address")


@serve.ingress()
class EngineReplica:
    """One replica: `lensapp engine`'s engine and app, from `settings` (its flags by name; the key from the
    replica's environment or key file)."""

    async def __init__(self, settings: dict):
        start = time.perf_counter()
        cfg = checked_config(argparse.Namespace(**settings))
        config.prepare_process_environment()
        # vLLM's start blocks for a minute: in a thread, so the replica's loop answers Ray meanwhile.
        self.backend, warm = await asyncio.to_thread(start_engine, cfg)
        await warm()
        self.engine_app = served_app(self.backend, cfg.secrets.engine_key)
        print(f"Lens Explorer engine replica ready in {time.perf_counter() - start:.1f} s", flush=True)

    def __serve_build_asgi_app__(self):
        return self.engine_app

    def check_health(self) -> None:
        """Raises once this replica's vLLM engine has died: Serve then replaces the replica."""
        reason = self.backend.failure()
        if reason:
            raise RuntimeError(f"the engine died ({reason})")

    def __del__(self):
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()


def application(args: argparse.Namespace, cfg: config.Config):
    """The Serve application for `lensapp engine`'s parsed flags (`args`, read as `cfg`): EngineReplica, its
    options."""
    engine = cfg.engine
    gpus = args.replica_gpus
    if gpus is None:
        gpus = engine.tensor_parallel_size * engine.pipeline_parallel_size \
            if config.resolve_device(engine) == "cuda" else 0
    batch = cfg.limits.max_batch
    queued = QUEUED_BATCHES * batch * args.replicas if args.max_queued is None else args.max_queued
    settings = {k: v for k, v in vars(args).items() if k not in (*REPLICA_OPTIONS, "command")}
    deployment = serve.deployment(
        EngineReplica, name="engine", num_replicas=args.replicas,
        ray_actor_options={"num_cpus": args.replica_cpus, "num_gpus": gpus},
        max_ongoing_requests=batch, max_queued_requests=queued, backpressure_config={"status_code": 429},
        health_check_period_s=HEALTH_PERIOD_S, health_check_timeout_s=HEALTH_TIMEOUT_S)
    return deployment.bind(settings)


def build_app(args: dict):
    """Serve's application builder (`serve run lensapp.ray_serve:build_app replicas=2 jlens=lens.pt`, or a
    config file's `import_path` and `args`): `lensapp engine`'s flags by name, `true`/`false` for a switch."""
    parser = argparse.ArgumentParser(prog="lensapp.ray_serve:build_app")
    add_engine_arguments(parser)
    argv: list[str] = []
    for name, value in {"replicas": 1, **args}.items():
        flag = f"--{name.replace('_', '-')}"
        if str(value).lower() in ("true", "false"):
            argv += [flag] if str(value).lower() == "true" else []
        else:
            argv += [flag, str(value)]
    args = parser.parse_args(argv)
    return application(args, checked_config(args))


def main(args: argparse.Namespace) -> int:
    """`lensapp engine --replicas N`: a local Ray (or `--ray-address`'s), Serve's proxy on --host:--port, the
    replicas, until SIGTERM or ^C; then Serve and the Ray it started are shut down."""
    import ray

    try:
        if args.replicas < 0 or args.replica_cpus < 0 or (args.replica_gpus or 0) < 0:
            raise config.ConfigError("--replicas, --replica-cpus and --replica-gpus take numbers >= 0")
        cfg = checked_config(args)               # here first: a bad flag is one line, not N failed replicas
        app = application(args, cfg)
    except config.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    host, port = cfg.web.host, cfg.web.port
    print(f"Starting the Lens Explorer engine on Ray Serve: {args.replicas} replicas behind "
          f"http://{host}:{port}/", flush=True)
    if not config.is_loopback_host(host):
        print(f"WARNING: the engine listens on {host}, beyond this machine, and runs code sent to it by anyone "
              "with its key: keep the key secret and the port behind a firewall or TLS (docs/hosting.md).",
              file=sys.stderr, flush=True)
    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=True)
    stop = threading.Event()

    def stopping(signum, frame):
        """Ours, not ray.init's (which exits at once): the replicas and the Ray they run on are shut down."""
        if stop.is_set() or not serving:
            raise KeyboardInterrupt              # still starting: out of serve.run, to the shutdown below
        stop.set()

    serving = False
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping)
    try:
        serve.start(http_options={"host": host, "port": port})
        start = time.perf_counter()
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(f"Lens Explorer engine ready on http://{host}:{port}/ ({args.replicas} replicas on Ray Serve, started "
              f"in {time.perf_counter() - start:.1f} s; pages: --engine-url http://{host}:{port})", flush=True)
        serving = True
        stop.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    except RuntimeError as e:                    # a replica that could not start (Serve says which, and why)
        print(f"error: the replicas did not start: {e}", file=sys.stderr)
        return 1
    finally:
        if args.ray_address:                     # a cluster's Serve may hold others' apps: only ours goes
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
        ray.shutdown()
