"""A room behind one address (issue 48): thirty people reach the real app (the tiny service, over HTTP) from one
address of a network namespace the test makes (not loopback, which no per-address limit touches), with the example
workshop file's settings, each through a session of their own as a page keeps one.

They arrive within a few seconds (each page's first load asks PAGE_LOAD times, as the workshop's page does), then
three times everyone asks a short readout within 4 s, as a room does when the host says "now this one": none is
refused. Then a script at the same address takes a fresh session for every request in a loop: it is limited as the
address alone is, however many people are known behind it.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest
from netns import namespace, unavailable
from tiny_app import served

from lensapp import config, workshop
from lensapp.server import make_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "workshops" / "where-does-the-answer-appear.yaml"
PEOPLE, ROUNDS, WITHIN_S, APART_S, ARRIVE_S = 30, 3, 4.0, 8.0, 5.0
PAGE_LOAD = 5           # guarded requests a workshop page's first load makes (the examples of its tabs), measured
ROTATING_CALLS = 60

# Runs inside the namespace, standard library only: a room of people, each with a session of their own, then a
# script rotating sessions; what each request came to, by phase, as one JSON line.
CLIENT = r'''
import http.client, json, random, sys, threading, time, uuid
host, port, plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
REFUSED = ("too many requests", "too much work", "running or waiting", "busy")
rng, lock, outcomes = random.Random(0), threading.Lock(), {}

def ask(session):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    body = json.dumps({"data": plan["data"], "fn_index": plan["fn_index"], "session_hash": session,
                       "trigger_id": None, "event_data": None})
    conn.request("POST", "/gradio_api/queue/join", body, {"Content-Type": "application/json"})
    joined = conn.getresponse()
    text = joined.read().decode()
    if joined.status != 200:
        return "lost: join " + text[:80]
    conn.request("GET", "/gradio_api/queue/data?session_hash=" + session)
    for raw in conn.getresponse():
        line = raw.decode().strip()
        if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
            message = json.loads(line[5:])
            error = str((message.get("output") or {}).get("error") or "")
            if message.get("success") and not error:
                return "answered"
            return ("refused: " if any(r in error.lower() for r in REFUSED) else "lost: ") + error[:80]
    return "lost: the stream closed"

def count(phase, outcome):
    with lock:
        outcomes.setdefault(phase, {}).setdefault(outcome, 0)
        outcomes[phase][outcome] += 1

def person(session, start, arrive_at, round_at):
    time.sleep(max(0.0, start + arrive_at - time.time()))
    for _ in range(plan["page_load"]):
        count("arrival", ask(session))
    for r, at in enumerate(round_at):
        time.sleep(max(0.0, start + at - time.time()))
        count(f"round {r + 1}", ask(session))

start = time.time() + 0.5
rounds = [plan["arrive_s"] + 6 + r * plan["apart_s"] for r in range(plan["rounds"])]
people = [threading.Thread(target=person, args=(uuid.uuid4().hex[:11], start, rng.uniform(0, plan["arrive_s"]),
                                                [at + rng.uniform(0, plan["within_s"]) for at in rounds]))
          for _ in range(plan["people"])]
for p in people:
    p.start()
for p in people:
    p.join()
began = time.time()
for _ in range(plan["rotating"]):
    count("rotating", ask(uuid.uuid4().hex[:11]))
print(json.dumps({"outcomes": outcomes, "rotating_s": time.time() - began}))
'''


def lens_call(url: str) -> dict:
    """The /lens endpoint's fn_index and a short readout's data, every parameter in order (a raw queue join fills
    in no defaults)."""
    def get(path: str) -> dict:
        with urllib.request.urlopen(url + path, timeout=30) as r:
            return json.loads(r.read())

    params = get("gradio_api/info")["named_endpoints"]["/lens"]["parameters"]
    values = {"prompt": "The capital of France is", "lens": "logit", "layers": "all", "k": 3}
    fn_index = next(d["id"] for d in get("config")["dependencies"] if d.get("api_name") == "lens")
    return {"fn_index": fn_index, "data": [values.get(p["parameter_name"], p.get("parameter_default"))
                                           for p in params]}


@pytest.fixture(scope="module")
def room():
    if unavailable():
        pytest.skip(unavailable())
    try:
        with namespace("room") as ns:
            yield ns
    except RuntimeError as e:
        pytest.skip(str(e))


def test_thirty_people_behind_one_address_are_a_room_and_a_rotating_script_is_its_address(room, tiny_service):
    plan = workshop.load(EXAMPLE)
    cfg = plan.apply(config.Config())
    with served(make_app(tiny_service, cfg, plan), room.host) as url:
        client = {**lens_call(url), "people": PEOPLE, "page_load": PAGE_LOAD, "arrive_s": ARRIVE_S,
                  "rounds": ROUNDS, "within_s": WITHIN_S, "apart_s": APART_S, "rotating": ROTATING_CALLS}
        port = url.rstrip("/").rsplit(":", 1)[1]
        done = room.run([sys.executable, "-c", CLIENT, room.host, port, json.dumps(client)])
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = got["outcomes"]
    assert outcomes["arrival"] == {"answered": PEOPLE * PAGE_LOAD}, outcomes
    for r in range(1, ROUNDS + 1):
        assert outcomes[f"round {r}"] == {"answered": PEOPLE}, outcomes
    # The script shares the address's own requests: a burst of a fifth of the rate a minute, then the rate.
    rotating = outcomes["rotating"]
    most = cfg.limits.rate_limit // 5 + cfg.limits.rate_limit / 60 * got["rotating_s"] + 1
    assert rotating.get("answered", 0) <= most and sum(rotating.values()) == ROTATING_CALLS, (rotating, most)
    assert all(k == "answered" or k.startswith("refused: too many requests from your address") for k in rotating)
