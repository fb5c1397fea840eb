"""A room and a script behind one address (issue 60): the figures of tests/test_room.py on the real app.

`lensapp serve` (the embedded model on vLLM unless `--serve` says otherwise, default limits) listens on the host end
of a network namespace the bench makes (tests/netns.py; needs root), and from the namespace, standard library only
(tests/test_room.py's client, the same one):

  room    30 people new to the app: each loads the page (its visitor cookie), then asks two short readouts (the
          logit lens at every layer, k 3, a prompt of its own) with that cookie, all starting within 4 s
  script  40 sessions of one script at the room's address (a session hash each, no cookie: what forty
          gradio_client.Clients send), each asking three readouts, one after another, all starting within 4 s
  other   a visitor at another address of the namespace, asking one readout a second, eight in all

Three phases on one app: the room and the other visitor alone, then the same room (their cookies kept) with the
script beside them, then alone again (the first phase is also the engine's first load since its start). Reported:
each party's answered and refused, and its latency's p50 and p95 (the join to the answer, refused ones included: a
refusal is answered at once). One JSON line at the end.

    python bench/room.py
    python bench/room.py --serve --model tests/.tiny --backend transformers     # any flags `lensapp serve` takes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

from load import REPO, App

sys.path.insert(0, str(REPO / "tests"))
from netns import namespace, unavailable  # noqa: E402 - the tests' namespace, one helper for both
from test_room import CLIENT, lens_call  # noqa: E402 - the test's client: the bench measures what the test asserts


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[round(q * (len(values) - 1))] if values else float("nan")


def summary(asks: list) -> dict:
    times = [s for _, s in asks]
    outcomes = Counter("answered" if o == "answered" else o.split(";")[0][:60] for o, _ in asks)
    return {"asked": len(asks), "answered": outcomes.pop("answered", 0), "refused": dict(outcomes),
            "p50_s": round(percentile(times, 0.5), 2), "p95_s": round(percentile(times, 0.95), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=30, help="the room's people, each a browser new to the app")
    parser.add_argument("--script-sessions", type=int, default=40, help="the script's sessions, none with a cookie")
    parser.add_argument("--script-asks", type=int, default=3, help="readouts each of the script's sessions asks")
    parser.add_argument("--within", type=float, default=4.0, help="seconds within which everyone starts asking")
    parser.add_argument("--other-asks", type=int, default=8, help="readouts the visitor at another address asks")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, default=[], help="flags for `lensapp serve`, last")
    args = parser.parse_args(argv)
    if unavailable():
        print(f"error: {unavailable()}", file=sys.stderr)
        return 2
    quiet = {"within_s": args.within, "person_asks": 2, "script_sessions": 0, "script_asks": 0,
             "other_asks": args.other_asks}
    phases = [quiet, {**quiet, "script_sessions": args.script_sessions, "script_asks": args.script_asks}, quiet]
    with namespace("broom", clients=2) as ns:
        app = App(None, args.serve, host=ns.host)
        try:
            plan = {**lens_call(app.url), "people": args.people, "room": ns.clients[0], "other": ns.clients[1],
                    "cookie": "lensapp_visitor", "other_every_s": 1.0, "phases": phases}
            port = app.url.rstrip("/").rsplit(":", 1)[1]
            began = time.time()
            done = ns.run([sys.executable, "-c", CLIENT, ns.host, port, json.dumps(plan)], timeout=1800)
            health = app.health()
        finally:
            app.close()
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    got = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {name: {who: summary(phase[who]) for who in ("room", "script", "other")} | {"seconds": phase["seconds"]}
            for name, phase in zip(("alone", "beside the script", "alone again"), got)}
    print(f"{'phase':<18} {'party':<7} {'asked':>5} {'answered':>8} {'p50 s':>6} {'p95 s':>6}  refused")
    for name, row in rows.items():
        for who in ("room", "script", "other"):
            r = row[who]
            if r["asked"]:
                print(f"{name:<18} {who:<7} {r['asked']:>5} {r['answered']:>8} {r['p50_s']:>6} {r['p95_s']:>6}  "
                      f"{r['refused'] or '-'}")
    print(json.dumps({"phases": rows, "cookies": got[0]["cookies"], "wall_s": round(time.time() - began, 1),
                      "calls": health.get("calls"), "restarts": health.get("restarts")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
