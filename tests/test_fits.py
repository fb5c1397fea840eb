"""The fitting desk (service/fits.py) and the fitter's process (fitting/worker.py), on the tiny random Llama:
fits run one at a time in their own process, identical ones are fitted once, the line is bounded and says
each waiter's place, who may fit is the host's choice, and a fitter that dies is replaced."""

from __future__ import annotations

import multiprocessing
import pickle
import secrets
import threading
import time

import pytest
import torch

from lensapp.config import Config
from lensapp.fitting import worker
from lensapp.fitting.steering import SteerConfig
from lensapp.service.asks import Ask
from lensapp.service.fields import RequestError
from lensapp.service.fits import FitDesk

IDS = (1, 504, 3458, 282, 4649, 314)
STEER = SteerConfig(objective="output", positions=(2, 5), max_steps=20, threshold=0.99)


def desk(tiny_model_dir, **settings) -> FitDesk:
    cfg = Config.of(model=str(tiny_model_dir), backend="transformers", jlens="none", **settings)
    return FitDesk(cfg.fits, cfg.limits.fit_queue, cfg.engine, has_login=bool(cfg.secrets.auth_pairs))


def test_identical_fits_at_once_are_fitted_once_in_another_process(tiny_model_dir):
    """...and paid for once, by whoever's fit ran (a fit the desk holds or is making for someone costs nothing)."""
    d = desk(tiny_model_dir)
    heard, out, spent = [], [None] * 4, []
    try:
        def ask(i):
            out[i] = d.fit(IDS, 2, 42, STEER, progress=lambda *a: heard.append(a), work=1000,
                           ask=Ask(payer=lambda units: spent.append((i, units))))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert all(o is not None for o in out)
        assert all(torch.equal(o.vector, out[0].vector) for o in out)
        assert sum(1 for step, _, _ in heard if step == 0) == 1            # one fit ran; the others waited for it
        assert d._worker._process.pid != threading.get_native_id()
        assert [units for _, units in spent] == [1000]
        d.fit(IDS, 2, 42, STEER, work=1000, ask=Ask(payer=lambda units: spent.append(("again", units))))   # held: free
        assert len(spent) == 1
    finally:
        d.close()


def test_the_line_is_bounded_says_each_place_and_a_refusal_is_one_line(tiny_model_dir):
    d = desk(tiny_model_dir, fit_queue=1)
    slow = SteerConfig(objective="output", max_steps=200, threshold=0.999999, max_seconds=30)
    heard = []
    try:
        first = threading.Thread(target=d.fit, args=(IDS, 1, 7, slow))
        first.start()
        time.sleep(0.5)
        second = threading.Thread(target=d.fit, args=(IDS, 1, 8, slow), kwargs={"progress": lambda *a: heard.append(a)})
        second.start()
        time.sleep(0.5)
        with pytest.raises(RequestError, match="2 steering fits are running or waiting") as e:
            d.fit(IDS, 1, 9, slow)
        assert "\n" not in str(e.value)
        first.join(300)
        second.join(300)
        assert heard[0] == (-1, 0.0, 0.0)                                  # told its place: one fit ahead
    finally:
        d.close()


def test_the_fitters_process_is_handed_the_models_settings_and_no_secret(tiny_model_dir, monkeypatch):
    """The fitter's process loads the model, so it is sent the engine's settings: never the app's logins, /health's
    token or the engine key (it was sent the whole Config, secrets and all, before settings were nested)."""
    spawn, handed = multiprocessing.get_context("spawn"), []

    class Recording:             # the spawn context, keeping what each process is handed (the pipe's end aside)
        Pipe = staticmethod(spawn.Pipe)

        def Process(self, target, args, **kwargs):  # noqa: N802 - multiprocessing's name
            handed.append(args[:2])
            return spawn.Process(target=target, args=args, **kwargs)

    monkeypatch.setattr(worker.multiprocessing, "get_context", lambda method: Recording())
    cfg = Config.of(model=str(tiny_model_dir), backend="transformers", jlens="none", auth="alice:pw-in-auth",
                    health_token="token-in-health", engine_key=secrets.token_urlsafe(32))
    d = FitDesk(cfg.fits, cfg.limits.fit_queue, cfg.engine, has_login=True)
    try:
        d.fit(IDS, 2, 42, SteerConfig(objective="output", positions=(2, 5), max_steps=2))
    finally:
        d.close()
    assert handed == [(cfg.engine, cfg.fits.fit_threads)]
    sent = pickle.dumps(handed)
    assert not [s for s in ("pw-in-auth", "token-in-health", cfg.secrets.engine_key) if s.encode() in sent]


def test_who_may_fit_is_the_hosts_choice(tiny_model_dir):
    host_only = desk(tiny_model_dir, fitting="host")
    with pytest.raises(RequestError, match="for the host"):
        host_only.check_allowed("203.0.113.9")
    host_only.check_allowed()                                             # the machine's own users may
    desk(tiny_model_dir, fitting="host", auth="alice:pw").check_allowed("203.0.113.9")   # with a login, visitors may
    for settings in ({"fitting": "off"}, {"max_fit_steps": 0}):
        with pytest.raises(RequestError, match="turned off"):
            desk(tiny_model_dir, **settings).check_allowed()
    off = desk(tiny_model_dir)
    off.off_reason = "no memory for it"
    with pytest.raises(RequestError, match="no memory for it"):
        off.check_allowed()


def test_a_fitter_that_dies_is_told_and_replaced(tiny_model_dir):
    d = desk(tiny_model_dir)
    slow = SteerConfig(objective="output", max_steps=100_000, threshold=0.999999, max_seconds=120)
    failed = []
    try:
        def ask():
            try:
                d.fit(IDS, 1, 9, slow)
            except RequestError as e:
                failed.append(str(e))

        t = threading.Thread(target=ask)
        t.start()
        deadline = time.monotonic() + 120
        while (d._worker._process is None or not d._worker._process.is_alive()) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        d._worker._process.kill()
        t.join(60)
        assert failed and "died" in failed[0]
        assert d.fit(IDS, 2, 42, STEER).vector.shape == (32,)               # a fresh process serves the next
    finally:
        d.close()


def test_a_fit_abandoned_mid_way_never_hands_its_answer_to_the_next(tiny_model_dir):
    d = desk(tiny_model_dir)
    slow = SteerConfig(objective="output", max_steps=200, threshold=0.999999, max_seconds=30)

    def leaves(step, p, norm):                   # the asker's page went away after the first step
        if step >= 1:
            raise ConnectionResetError("the visitor left")

    heard = []
    try:
        with pytest.raises(ConnectionResetError):
            d.fit(IDS, 1, 7, slow, progress=leaves)
        fit = d.fit(IDS, 2, 42, STEER, progress=lambda *a: heard.append(a))
        assert fit.layer == 2 and fit.steps <= STEER.max_steps              # its own answer, not the one left
        assert [step for step, _, _ in heard][:2] == [0, 1]                 # and its own progress from the start
    finally:
        d.close()
