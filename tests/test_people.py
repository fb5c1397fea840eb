"""The people behind one address (`identity.People`) through the real Guard and RateLimiter, the clock stopped and
moved by hand (issue 60): a browser that loaded the page (its signed visitor cookie) is a person from its first
request, with requests, a turn and a work budget of its own; two browsers under one login are two people; anything
without a valid cookie (a session hash, a forged or foreign cookie) is its address, however many sessions it takes;
an address is given a room's worth of new cookies at once, and at most ROOM_PEOPLE are seated behind it. Then the
page's GET through the app's middleware: the cookie it sets, and its attributes over HTTP and behind HTTPS."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from lensapp.service import identity
from lensapp.service.asks import asked
from lensapp.service.identity import NEW_VISITORS, ROOM_PEOPLE, VISITOR_COOKIE, People
from lensapp.service.limits import RateLimiter
from lensapp.ui.guard import Guard

ROOM = "198.51.100.20"
REPO = Path(__file__).resolve().parents[1]


def spend(units: int) -> None:
    """What the service does where engine work starts, in an entry given no ask: the handler's ask pays."""
    asked().pay(units)


def page(cookie: str | None = None, login: str | None = None, host: str = ROOM, session: str = "s"):
    """A request as Gradio hands it to a handler: the peer, its headers (the browser's cookies), the page's session
    hash, the login."""
    headers = {"cookie": f"other=1; {VISITOR_COOKIE}={cookie}"} if cookie is not None else {}
    return SimpleNamespace(client=SimpleNamespace(host=host), headers=headers, session_hash=session, username=login)


def stopped_guard(per_minute: int = 60, work_per_minute: int = 0, work_burst: int | None = None, burst: int = 2):
    now = [0.0]
    limiter = RateLimiter(per_minute, burst=burst, clock=lambda: now[0], work_per_minute=work_per_minute,
                          work_burst=work_burst)
    return Guard(limiter, people=People(clock=lambda: now[0])), now


def answered(guard: Guard, request, fn=lambda: None) -> bool:
    try:
        guard.api(request, fn)
    except gr.Error as e:
        assert "too many requests" in e.message or "too much work" in e.message, e.message
        return False
    return True


def turn_of(guard: Guard, request) -> str:
    seen = []
    guard.api(request, lambda: seen.append(asked().client))
    return seen[0]


def test_a_browser_that_loaded_the_page_is_a_person_from_its_first_request():
    guard, _ = stopped_guard()
    people = [guard.people.new_visitor(ROOM) for _ in range(5)]
    turns = [turn_of(guard, page(cookie, session=f"s{i}")) for i, cookie in enumerate(people[:1] * 2 + people[1:])]
    assert len(set(turns)) == 5 and identity.turn(ROOM) not in turns     # a turn each, whatever their sessions
    guard, _ = stopped_guard()
    people = [guard.people.new_visitor(ROOM) for _ in range(5)]
    for _ in range(2):                                                  # each a burst of two of their own at once
        assert all(answered(guard, page(cookie)) for cookie in people)
    assert not any(answered(guard, page(cookie)) for cookie in people)
    assert answered(guard, page()) and answered(guard, page())         # the address's burst is untouched
    assert guard.people.count(ROOM) == 5


def test_a_visitor_has_a_work_budget_of_their_own_at_once():
    guard, _ = stopped_guard(per_minute=600, work_per_minute=60, work_burst=100)
    alice, bob = guard.people.new_visitor(ROOM), guard.people.new_visitor(ROOM)
    assert answered(guard, page(alice), lambda: spend(100))
    assert answered(guard, page(bob), lambda: spend(100))              # hers is not his, nor the address's
    assert answered(guard, page(), lambda: spend(100))
    assert not answered(guard, page(alice), lambda: spend(10))


@pytest.mark.parametrize("forged", ["", "x", "abc.def", "a" * 200, ".", "<b>.1"])
def test_without_a_valid_cookie_every_session_is_the_address(forged):
    """A session hash names nobody (a script with forty sessions is one address), nor a cookie this process did not
    sign: made up, its signature changed, or signed by another process."""
    guard, _ = stopped_guard()
    real = guard.people.new_visitor(ROOM)
    tampered = real[:-1] + ("0" if real[-1] != "0" else "1")
    foreign = People().new_visitor(ROOM)
    requests = [page(session=f"s{i}") for i in range(8)] + [page(c, session=f"c{i}") for i, c in
                                                            enumerate([forged, tampered, foreign] * 2)]
    assert sum(answered(guard, r) for r in requests) == 2                # the address's burst, and no more
    assert guard.people.count(ROOM) == 0
    assert answered(guard, page(real))                                  # the real one is a person still
    now = [1000.0]                                                       # refilled: each asks once more
    guard.limiter.clock = lambda: now[0]
    turns = {turn_of(guard, r) for r in requests[:2]}
    assert turns == {identity.turn(ROOM)}                               # one turn at the engine: one person's share


def test_two_browsers_under_one_login_are_two_people_and_the_login_without_a_cookie_is_one():
    guard, _ = stopped_guard(work_per_minute=60, work_burst=100, burst=10)
    first, second = guard.people.new_visitor(ROOM), guard.people.new_visitor(ROOM)
    turns = {turn_of(guard, page(cookie, login="room")) for cookie in (first, second)}
    assert len(turns) == 2 and all(ROOM in t and "room" not in t for t in turns)   # a login's name is never kept
    assert answered(guard, page(first, login="room"), lambda: spend(100))
    assert answered(guard, page(second, login="room"), lambda: spend(100))   # one login, two budgets
    assert turn_of(guard, page(first, login="other")) not in turns       # another login in that browser: another
    bare = {turn_of(guard, page(login="room", session=f"s{i}")) for i in range(3)}
    assert len(bare) == 1 and not bare & turns and identity.turn(ROOM) not in bare   # the login's, one person


def test_an_address_is_given_a_rooms_worth_of_new_visitors_at_once_then_a_few_a_minute():
    now = [0.0]
    people = People(clock=lambda: now[0])
    given = [people.new_visitor(ROOM) for _ in range(NEW_VISITORS + 5)]
    assert all(given[:NEW_VISITORS]) and not any(given[NEW_VISITORS:])
    assert people.new_visitor("203.0.113.9") is not None                 # another address: its own
    now[0] += identity.NEW_VISITOR_SECONDS / NEW_VISITORS
    assert people.new_visitor(ROOM) is not None and people.new_visitor(ROOM) is None
    assert len({people.visitor(c) for c in given[:NEW_VISITORS]}) == NEW_VISITORS


def test_at_most_room_people_are_seated_and_a_newcomer_takes_the_place_of_one_long_unseen():
    now = [0.0]
    people = People(clock=lambda: now[0], secret=b"k" * 32)
    cookies = [f"p{i}.{people._sign(f'p{i}')}" for i in range(ROOM_PEOPLE)]
    late, again = (f"{v}.{people._sign(v)}" for v in ("late", "again"))
    for cookie in cookies:
        people.who(ROOM, cookie)
    now[0] += 1.0
    for cookie in cookies:
        people.who(ROOM, cookie)                                        # each came back: people, not a script
    assert people.who(ROOM, late).person is None and people.count(ROOM) == ROOM_PEOPLE
    now[0] += identity.IDLE_SECONDS
    for cookie in cookies[:1] + cookies[2:]:
        people.who(ROOM, cookie)                                        # all but p1 seen again
    assert people.who(ROOM, late).person is not None                   # p1, long unseen, gave way
    assert people.who(ROOM, cookies[1]).person is None                  # and finds the room full
    assert people.count("203.0.113.9") == 0                             # another address: its own room
    now[0] += identity.STANDING_SECONDS + 1
    people.who(ROOM, again)
    assert people.count(ROOM) == 1                                      # the rest were forgotten


def test_the_example_logins_give_the_host_one_of_their_own():
    """Issue 60: the first login is the host's (/workshop, /health), so a workshop example with one login makes
    everyone who uses it the host. Every example of `auth` for a workshop (the workshop module's, its guide's, the
    shipped files' and the checklist's) names the host and, after it, the participants' login(s)."""
    files = [REPO / "lensapp" / "workshop.py", REPO / "docs" / "workshop.md", *sorted((REPO / "workshops").glob("*"))]
    examples = [(f.name, m) for f in files
                for m in re.findall(r"""(?:auth:\s*["']|LENSAPP_AUTH=)([^"'`\s]+)""", f.read_text())
                if ":" in m]
    assert examples
    for name, value in examples:
        users = [pair.split(":")[0] for pair in value.split(",")]
        assert len(users) >= 2 and users[0] not in users[1:], (name, value)


def test_the_page_sets_a_signed_httponly_visitor_cookie_once(tiny_service):
    from fastapi.testclient import TestClient

    from lensapp import config
    from lensapp.server import make_app

    with TestClient(make_app(tiny_service, config.Config.of(trusted_proxies="1")), base_url="http://testserver") as c:
        got = c.get("/", headers={"x-forwarded-for": ROOM})
        line = got.headers["set-cookie"]
        assert line.startswith(f"{VISITOR_COOKIE}=") and "HttpOnly" in line and "SameSite=Lax" in line
        assert "Secure" not in line
        assert "set-cookie" not in c.get("/", headers={"x-forwarded-for": ROOM}).headers    # it holds one now
        c.cookies.clear()
        framed = c.get("/", headers={"x-forwarded-for": ROOM, "x-forwarded-proto": "https"}).headers["set-cookie"]
        assert "SameSite=None; Secure; Partitioned" in framed and "HttpOnly" in framed
        c.cookies.clear()
        forged = c.get("/", headers={"x-forwarded-for": ROOM, "cookie": f"{VISITOR_COOKIE}=made.up"})
        assert forged.headers["set-cookie"].startswith(f"{VISITOR_COOKIE}=")             # a made-up one: a new one
        assert "set-cookie" not in c.get("/config").headers                             # the page's GET only
