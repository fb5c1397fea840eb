"""The one error path and fair use: one plain line for API clients, escaped text on the page, rate limits."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from lensapp.engine import EngineBusy, EngineDown, EngineRestarted
from lensapp.service.limits import ANSWER_BYTES, RateLimited, RateLimiter
from lensapp.service.requests import RequestError
from lensapp.ui.guard import Guard, client_address


def request(host: str, forwarded: str | None = None):
    return SimpleNamespace(client=SimpleNamespace(host=host), headers={"x-forwarded-for": forwarded} if forwarded
                           else {})


@pytest.mark.parametrize("error, title", [
    (RequestError("k must be a whole number; got '<b>five</b>'"), "Can't run that"),
    (EngineBusy("the app is busy; try again in a moment"), "Busy"),
    (EngineRestarted("the model restarted; please run again"), "The model"),
])
def test_expected_failures_are_one_line_logged_once(error, title, caplog):
    guard = Guard(RateLimiter(0))

    def fail():
        raise error

    with caplog.at_level(logging.INFO, logger="lensapp.ui.guard"), pytest.raises(gr.Error) as api:
        guard.api(request("127.0.0.1"), fail)
    assert api.value.message == str(error) and api.value.title == title and "&#" not in api.value.message
    with pytest.raises(gr.Error) as page:
        guard.ui(request("127.0.0.1"), fail)
    assert "<b>" not in page.value.message                       # the page renders errors as HTML: escaped
    records = [r for r in caplog.records if r.name == "lensapp.ui.guard"]
    assert len(records) == 1 and records[0].exc_info is None and "\n" not in records[0].getMessage()


def test_an_engine_fault_logs_its_traceback_and_says_one_line(caplog):
    def fault():
        raise ZeroDivisionError("division by zero\nand a second line")

    with caplog.at_level(logging.INFO, logger="lensapp.ui.guard"), pytest.raises(gr.Error) as e:
        Guard(RateLimiter(0)).api(None, fault)
    reference = re.fullmatch(r"something failed on the server \(reference ([0-9a-f]{8}): the host's log has the "
                             r"details\)", e.value.message)[1]                  # not the exception's text
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and reference in logged[0].getMessage() and logged[0].exc_info[0] is ZeroDivisionError


def test_an_unexpected_error_shows_a_reference_not_its_text(caplog):
    """An exception's text may name the server's files: the visitor gets a reference, the log the rest."""
    def fault():
        raise OSError(2, "No such file or directory", "/root/.cache/lensapp/models/secret-folder/config.json")

    with caplog.at_level(logging.INFO, logger="lensapp.ui.guard"), pytest.raises(gr.Error) as e:
        Guard(RateLimiter(0)).ui(None, fault)
    assert "reference" in e.value.message and "/root" not in e.value.message and "secret" not in e.value.message
    assert "secret-folder" in "".join(logging.Formatter().formatException(r.exc_info) for r in caplog.records
                                      if r.exc_info)


def test_an_expected_error_names_files_by_their_name_only():
    def fail():
        raise EngineDown("the model is down: the model could not start: no config in /root/.cache/lensapp/x/y")

    with pytest.raises(gr.Error) as e:
        Guard(RateLimiter(0)).api(None, fail)
    assert e.value.message == "the model is down: the model could not start: no config in y"


def test_rate_limit_per_address_with_bursts_and_loopback_free():
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=3, clock=lambda: now[0])
    for _ in range(3):
        limiter.check("203.0.113.7")
    with pytest.raises(RateLimited, match="try again in 1 s"):
        limiter.check("203.0.113.7")
    limiter.check("198.51.100.1")                                 # another address has its own bucket
    now[0] += 1.0
    limiter.check("203.0.113.7")                                  # a second later: one more
    for _ in range(100):
        limiter.check("127.0.0.1")                                # loopback is never limited
    assert limiter.refused == 1


def test_a_large_answer_counts_as_more_than_one_request():
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=12, clock=lambda: now[0])
    limiter.check("203.0.113.7")
    limiter.charge("203.0.113.7", 26 * ANSWER_BYTES)                 # far more than a burst: a burst below zero
    with pytest.raises(RateLimited, match="try again in 13 s"):
        limiter.check("203.0.113.7")
    now[0] += 13.0
    limiter.check("203.0.113.7")
    for _ in range(3):
        limiter.charge("198.51.100.1", ANSWER_BYTES // 4)            # small answers: a quarter more each
    for _ in range(11):
        limiter.check("198.51.100.1")
    with pytest.raises(RateLimited):                                 # 12 - 0.75 left 11.25: the twelfth waits
        limiter.check("198.51.100.1")
    limiter.charge("127.0.0.1", 100 * ANSWER_BYTES)                  # loopback and the app itself: never charged
    limiter.charge(None, 100 * ANSWER_BYTES)
    limiter.check("127.0.0.1")


def test_the_guard_charges_an_answer_to_the_derived_address():
    guard = Guard(RateLimiter(per_minute=60, burst=2, clock=lambda: 0.0), trusted_proxies=1)
    asked = request("10.0.0.5", "localhost, 198.51.100.4")
    guard.answered(asked, 10 * ANSWER_BYTES)
    with pytest.raises(gr.Error, match="too many requests"):
        guard.api(asked, lambda: None)
    guard.api(request("10.0.0.5", "198.51.100.5"), lambda: None)     # another visitor behind the same proxy


def test_client_address_trusts_only_the_hops_the_host_names():
    assert client_address(request("10.0.0.5", "203.0.113.9, 10.0.0.1")) == "10.0.0.5"       # no proxy trusted
    assert client_address(request("10.0.0.5", "203.0.113.9, 10.0.0.1"), 1) == "10.0.0.1"
    assert client_address(request("10.0.0.5", "localhost"), 1) == "10.0.0.5"                 # a name: the peer
    assert client_address(request("8.8.8.8", "1.2.3.4")) == "8.8.8.8"
    assert client_address(request("testclient")) == "unidentified"                         # limited, not exempt
    assert client_address(None) is None                                                     # a call inside the app


def test_the_guard_limits_by_the_derived_address():
    guard = Guard(RateLimiter(per_minute=60, burst=2, clock=lambda: 0.0), trusted_proxies=1)
    for forged in ("localhost", "127.0.0.1", "203.0.113.1", "203.0.113.2"):      # the client's own first hops
        try:
            guard.api(request("10.0.0.5", f"{forged}, 198.51.100.4"), lambda: None)
        except gr.Error as e:
            assert "too many requests" in e.message
    assert guard.limiter.refused == 2


def test_work_is_taken_as_it_starts_or_refused_until_the_budget_holds_it():
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=12, clock=lambda: now[0], work_per_minute=6000, work_burst=1000)
    limiter.check("203.0.113.7")
    limiter.spend("203.0.113.7", 900)                     # within the burst: taken, 100 left
    limiter.check("203.0.113.7")                          # a cached answer costs nothing: let in
    with pytest.raises(RateLimited, match=r"too much work from your address for now; try again in 5 s"):
        limiter.spend("203.0.113.7", 600)                 # 100 < 600: 500 units to wait for, nothing taken
    limiter.spend("198.51.100.1", 600)                    # another address's budget is its own
    now[0] += 5.0
    limiter.spend("203.0.113.7", 600)                     # 600 now: taken, none left
    with pytest.raises(RateLimited, match="try again in 1 s"):
        limiter.spend("203.0.113.7", 1)
    now[0] += 10.0                                        # full again
    limiter.spend("203.0.113.7", 10**9)                   # dearer than a burst: from a full bucket, a burst below zero
    with pytest.raises(RateLimited, match="too much work from your address for now; try again in 10 s"):
        limiter.check("203.0.113.7")                      # in debt: even a cached answer waits
    assert limiter.refused == 3
    for client in ("127.0.0.1", None):                    # loopback and the app itself: never charged
        limiter.spend(client, 10**9)
        limiter.check(client)


def test_the_guard_spends_the_work_done_inside_it_from_the_asker():
    from lensapp.service.asks import asked

    def spend(units: int) -> None:              # what a service entry given no ask does: the handler's ask pays
        asked().pay(units)

    guard = Guard(RateLimiter(per_minute=600, clock=lambda: 0.0, work_per_minute=600, work_burst=100))
    guard.api(request("203.0.113.7"), spend, 150)         # what the service spends where engine work starts
    with pytest.raises(gr.Error, match="too much work"):
        guard.api(request("203.0.113.7"), lambda: None)
    guard.api(request("198.51.100.2"), lambda: None)
    spend(10**9)                                          # outside any guard: nobody's (the app's own work)
    guard.api(request("198.51.100.2"), lambda: None)


def test_penalties_survive_eviction_and_newcomers_share_an_overflow_bucket():
    """The table forgets only full buckets: a penalised address stays penalised however many others come by."""
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=2, clock=lambda: now[0], max_clients=10)
    for _ in range(2):
        limiter.check("203.0.113.7")
    with pytest.raises(RateLimited):
        limiter.check("203.0.113.7")
    for i in range(50):                                   # a crowd of newcomers while it is still penalised
        try:
            limiter.check(f"198.51.100.{i}")
        except RateLimited:
            pass                                          # overflowed newcomers share one bucket
    with pytest.raises(RateLimited):
        limiter.check("203.0.113.7")
    assert len(limiter._buckets) <= 11
    now[0] += 60.0                                        # everyone's bucket is full again: forgotten as needed
    for i in range(50):
        now[0] += 1.0                                     # a newcomer a second
        limiter.check(f"192.0.2.{i}")
