"""A forged X-Forwarded-For does not escape the rate limit, over a real network from a private peer.

The test makes its own network namespace and a veth pair on a private /29 (10.200.N.0, N from the
test's pid); the app (`server.make_app` over the tiny service) listens on the host end only, and a
client inside the namespace sends quick /lens calls through the HTTP API, each scenario from its own
address: no header, a name ("localhost"), a random address per call, extra hops. With no trusted proxy
the peer is the client; with one, the entry the proxy appends is (the client sends what a proxy in
front of it would forward: its own forged hops, then the address the proxy saw). Each forged scenario is
refused as often as its plain twin. Nothing but loopback and this namespace is ever addressed; the
namespace (and with it the veth pair) is deleted whatever happens.

Needs root and `ip netns` (iproute2); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest
from tiny_app import served

from lensapp import config
from lensapp.server import PUBLIC_HEALTH, make_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")

CALLS = 12                       # per scenario: a burst of 5 passes at 6 a minute, then ~1 every 10 s
SUBNET = f"10.200.{os.getpid() % 200 + 20}"
HOST_IP = f"{SUBNET}.1"
CLIENT_IPS = [f"{SUBNET}.{i}" for i in range(2, 7)]

# Runs inside the namespace, standard library only: each scenario's calls from its own source address.
CLIENT = r'''
import http.client, json, random, sys
host, port, calls, scenarios = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
rng = random.Random(0)

def forged(kind, seen):
    hops = {"none": [], "name": ["localhost"], "random": [".".join(str(rng.randrange(1, 255)) for _ in range(4))],
            "hops": ["127.0.0.1", "203.0.113.9", "localhost", "::1"]}[kind]
    return ", ".join(hops + seen)

def lens(source, header):
    conn = http.client.HTTPConnection(host, port, source_address=(source, 0), timeout=120)
    headers = {"Content-Type": "application/json", **({"X-Forwarded-For": header} if header else {})}
    # every parameter, sublayers last: Gradio's raw endpoints fill in no defaults
    body = json.dumps({"data": ["The capital of France is", "logit", "all", 1, "", False, False, False, False]})
    conn.request("POST", "/gradio_api/call/lens", body, headers)
    event = json.loads(conn.getresponse().read())["event_id"]
    conn.request("GET", f"/gradio_api/call/lens/{event}")
    answer = conn.getresponse().read().decode()
    assert "event: complete" in answer or "event: error" in answer, answer[:300]
    return "too many requests" in answer

refused = {}
for name, source, kind, seen in scenarios:
    refused[name] = sum(lens(source, forged(kind, seen)) for _ in range(calls))
conn = http.client.HTTPConnection(host, port, source_address=(scenarios[0][1], 0), timeout=30)
conn.request("GET", "/health", headers={"X-Forwarded-For": forged("hops", scenarios[0][3])})
print(json.dumps({"refused": refused, "health": json.loads(conn.getresponse().read())}))
'''


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture(scope="module")
def namespace():
    """(namespace name, the host end's address, the client's addresses) for a namespace made here."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2's `ip netns` to make a network namespace")
    name, host_if, ns_if = f"lens25-{os.getpid()}", f"lh{os.getpid()}", f"ln{os.getpid()}"
    made = ip("netns", "add", name, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", name)
        ip("addr", "add", f"{HOST_IP}/29", "dev", host_if)
        ip("link", "set", host_if, "up")
        for address in CLIENT_IPS:
            ip("netns", "exec", name, "ip", "addr", "add", f"{address}/29", "dev", ns_if)
        ip("netns", "exec", name, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name
    finally:
        ip("netns", "del", name, check=False)           # takes the veth pair with it
        ip("link", "del", host_if, check=False)
    assert name not in ip("netns", "list").stdout


def run_client(namespace: str, url: str, scenarios: list) -> dict:
    port = url.rstrip("/").rsplit(":", 1)[1]
    out = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", CLIENT, HOST_IP, port, str(CALLS),
                          json.dumps(scenarios)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("trusted", [0, 1])
def test_forged_forwarding_from_a_private_peer_is_limited_as_without_it(namespace, tiny_service, trusted):
    app = make_app(tiny_service, config.Config.of(rate_limit=6, trusted_proxies=str(trusted), health_token="x"))
    # With a trusted proxy, the last entry is what it saw: a client of its own per scenario.
    seen = [[f"198.51.100.{i}"] if trusted else [] for i in range(len(CLIENT_IPS))]
    kinds = ["none", "name", "random", "hops"]
    scenarios = [[kind, CLIENT_IPS[i], kind, seen[i]] for i, kind in enumerate(kinds)]
    with served(app, HOST_IP) as url:
        got = run_client(namespace, url, scenarios)
        with urllib.request.urlopen(url + "health", timeout=10) as r:      # the test's own request
            assert r.status == 200
    refused = got["refused"]
    plain = refused["none"]
    assert plain >= CALLS - 5 - 2, refused                                 # the limit holds for the plain calls
    for kind in kinds[1:]:
        assert abs(refused[kind] - plain) <= 1, (kind, refused)            # and for the forged ones alike
    assert set(got["health"]) <= set(PUBLIC_HEALTH), got["health"]         # forged loopback hops: not the host
