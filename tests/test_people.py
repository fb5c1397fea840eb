"""The people behind one address (`identity.People`) through the real Guard and RateLimiter, the clock stopped and
moved by hand: a session is the address's until a request of it is let in, then has requests and a turn of its own,
and its own work budget EARN_SECONDS later; a login is a person at once; a session hash seen once (a script
rotating them) adds nothing; at most ROOM_PEOPLE are known, a newcomer takes the place of one long unseen."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

from lensapp.service import identity
from lensapp.service.asks import asked
from lensapp.service.identity import EARN_SECONDS, IDLE_SECONDS, ROOM_PEOPLE, STANDING_SECONDS, People
from lensapp.service.limits import RateLimiter
from lensapp.ui.guard import Guard

ROOM = "198.51.100.20"


def spend(units: int) -> None:
    """What the service does where engine work starts, in an entry given no ask: the handler's ask pays."""
    asked().pay(units)


def page(session: str | None = None, login: str | None = None, host: str = ROOM):
    """A request as Gradio hands it to a handler: the peer, the page's session hash, the login."""
    return SimpleNamespace(client=SimpleNamespace(host=host), headers={}, session_hash=session, username=login)


def stopped_guard(per_minute: int = 60, work_per_minute: int = 0, work_burst: int | None = None):
    now = [0.0]
    limiter = RateLimiter(per_minute, burst=2, clock=lambda: now[0], work_per_minute=work_per_minute,
                          work_burst=work_burst)
    return Guard(limiter, people=People(clock=lambda: now[0])), now


def answered(guard: Guard, request, fn=lambda: None) -> bool:
    try:
        guard.api(request, fn)
    except gr.Error as e:
        assert "too many requests" in e.message or "too much work" in e.message, e.message
        return False
    return True


def test_a_session_has_requests_of_its_own_once_one_was_let_in_as_the_addresss():
    guard, now = stopped_guard()
    assert answered(guard, page("alice")) and answered(guard, page("bob"))     # the address's burst of two
    assert not answered(guard, page("carol"))                               # carol's first: the address is spent
    for _ in range(2):                                                      # alice and bob: bursts of their own
        assert answered(guard, page("alice")) and answered(guard, page("bob"))
    assert not answered(guard, page("alice"))
    assert guard.people.count(ROOM) == 2                                    # carol was refused: not known
    now[0] += 1.0
    assert answered(guard, page("carol")) and answered(guard, page("carol"))    # let in, then her own
    assert guard.people.count(ROOM) == 3


def test_a_script_rotating_sessions_shares_the_addresss_requests_however_many_people_are_known():
    guard, now = stopped_guard()
    for name in ("alice", "bob"):
        answered(guard, page(name))
        now[0] += 1.0
    rotating = [answered(guard, page(f"s{i}")) for i in range(10)]       # a fresh session hash every request
    assert sum(rotating) == 2                                                # the address's burst, and no more
    now[0] += 1.0
    assert answered(guard, page("alice")) and answered(guard, page("bob"))   # the room is untouched
    assert guard.people.count(ROOM) == 2 + 2                                 # the two it was let in are known


def test_a_sessions_work_is_the_addresss_until_it_has_earned_standing():
    guard, now = stopped_guard(per_minute=600, work_per_minute=60, work_burst=100)
    assert answered(guard, page("alice"), lambda: spend(60))                # let in as the address's: its work
    assert not answered(guard, page("alice"), lambda: spend(60))            # still the address's: 40 left
    now[0] += EARN_SECONDS
    assert answered(guard, page("alice"), lambda: spend(100))               # earned: a budget of her own
    assert not answered(guard, page("bob"), lambda: spend(60))             # the address's, 45 left after 5 s
    assert answered(guard, page("bob"), lambda: spend(45))


def test_a_login_is_a_person_at_once_and_a_person_waits_in_a_turn_of_their_own():
    guard, _ = stopped_guard(work_per_minute=60, work_burst=100)
    assert answered(guard, page("x", login="alice"), lambda: spend(100))
    assert answered(guard, page("y", login="bob"), lambda: spend(100))     # her budget is not his
    turns_seen = []
    for request in (page("x", login="alice"), page("y", login="bob"), page("new")):
        try:
            guard.api(request, lambda: turns_seen.append(asked().client))
        except gr.Error:
            pass
    alice, bob, newcomer = turns_seen
    assert len({alice, bob, newcomer}) == 3 and newcomer == identity.turn(ROOM)
    assert "alice" not in alice and ROOM in alice                          # a login's name is never kept


def test_at_most_room_people_are_known_and_a_newcomer_takes_the_place_of_one_long_unseen():
    now = [0.0]
    people = People(clock=lambda: now[0])
    for i in range(ROOM_PEOPLE):
        people.known(people.who(ROOM, f"p{i}"))
    now[0] += 1.0
    for i in range(ROOM_PEOPLE):
        people.who(ROOM, f"p{i}")                                           # each came back: people, not a script
    people.known(people.who(ROOM, "late"))
    assert people.count(ROOM) == ROOM_PEOPLE and people.who(ROOM, "late").person is None
    now[0] += IDLE_SECONDS / 2
    people.who(ROOM, "p0")                                                  # p0 seen again: not the one to go
    now[0] += IDLE_SECONDS / 2
    people.known(people.who(ROOM, "late"))
    assert people.who(ROOM, "late").person is not None and people.who(ROOM, "p0").person is not None
    assert people.who(ROOM, "p1").person is None                            # the least recently seen gave way
    assert people.count("203.0.113.9") == 0                                 # another address: its own room
    now[0] += STANDING_SECONDS + 1
    people.known(people.who(ROOM, "again"))
    assert people.count(ROOM) == 1                                          # the rest were forgotten


def test_sessions_seen_once_give_way_to_each_other_never_to_people_who_come_back():
    now = [0.0]
    people = People(clock=lambda: now[0])
    for i in range(ROOM_PEOPLE - 1):
        people.known(people.who(ROOM, f"p{i}"))
    now[0] += 1.0
    for i in range(ROOM_PEOPLE - 1):
        people.who(ROOM, f"p{i}")
    for i in range(100):                                                    # a script: a fresh session each time
        now[0] += 1.0
        people.known(people.who(ROOM, f"s{i}"))
    assert people.count(ROOM) == ROOM_PEOPLE
    assert all(people.who(ROOM, f"p{i}").person is not None for i in range(ROOM_PEOPLE - 1))
    assert people.who(ROOM, "s99").person is not None and people.who(ROOM, "s98").person is None


@pytest.mark.parametrize("session", ["", "a" * 65, "../x", "<b>", 7, None])
def test_a_session_hash_a_page_never_makes_names_nobody(session):
    people = People()
    people.known(people.who(ROOM, session))
    assert people.who(ROOM, session).person is None and people.count(ROOM) == 0
