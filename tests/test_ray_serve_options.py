"""The Ray Serve deployment's options as `lensapp engine --replicas` and Serve's CLI (`build_app`) make them, and
bad input refused in one line, without starting an engine (tests/test_ray_serve.py runs it)."""

import os
import secrets
import subprocess
import sys

import pytest
from conftest import REPO

pytest.importorskip("ray")

KEY = secrets.token_urlsafe(32)


def test_serve_cli_args_become_the_deployment_options(monkeypatch):
    from lensapp.ray_serve import HEALTH_PERIOD_S, build_app

    monkeypatch.setenv("LENSAPP_ENGINE_KEY", KEY)
    app = build_app({"replicas": "3", "max_batch": "4", "replica_cpus": "2", "jlens": "none"})
    deployment = app._bound_deployment          # Serve's Application keeps its deployment here (no public getter)
    assert deployment.num_replicas == 3
    assert deployment.ray_actor_options == {"num_cpus": 2.0, "num_gpus": 0}
    assert deployment.max_ongoing_requests == 4                  # one engine batch in flight on a replica
    assert deployment.max_queued_requests == 4 * 4 * 3           # QUEUED_BATCHES batches per replica, then 429
    config = deployment._deployment_config
    assert config.backpressure_config.status_code == 429 and config.health_check_period_s == HEALTH_PERIOD_S
    settings = app._bound_deployment.init_args[0]
    assert settings["max_batch"] == 4 and settings["jlens"] == "none"
    assert "replicas" not in settings and "engine_key" not in {k for k, v in settings.items() if v}
    assert KEY not in repr(settings)                              # the key never travels through Ray


def test_bad_replica_flags_are_one_line():
    run = [sys.executable, "-m", "lensapp", "engine", "--port", "6677"]        # nothing listens: refused first
    keyless_env = {k: v for k, v in os.environ.items() if k != "LENSAPP_ENGINE_KEY"}
    env = keyless_env | {"LENSAPP_ENGINE_KEY": KEY}
    refused = subprocess.run(run + ["--replicas", "-2"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: --replicas, --replica-cpus and --replica-gpus take numbers >= 0")
    keyless = subprocess.run(run + ["--replicas", "2"], cwd=REPO, env=keyless_env, capture_output=True,
                             text=True, timeout=120)
    assert keyless.returncode == 2 and keyless.stderr.count("\n") == 1 and "key" in keyless.stderr
