"""A network namespace of the test's own, joined to this one by a veth pair: its clients reach an app listening on
the host end from addresses that are not loopback (which no per-address limit touches), as a room behind one NAT
address reaches a Space. Private addresses only (a /29 of 10.N.M.0); nothing beyond this machine is addressed, and
the namespace (with it the veth pair) is deleted whatever happens.

    with namespace("room", clients=2) as ns:
        with served(app, ns.host) as url:
            ns.run([sys.executable, "-c", CLIENT, url, ns.clients[0]])

Needs root and iproute2's `ip netns`; `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Namespace:
    name: str
    host: str                   # the host end's address: where an app listens for the namespace's clients
    clients: tuple[str, ...]    # the namespace's own addresses, each a client the app tells apart

    def run(self, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        """`argv` run inside the namespace (its output captured, as text)."""
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True,
                              timeout=timeout)


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "making a network namespace needs root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@contextlib.contextmanager
def namespace(tag: str, clients: int = 1, second_octet: int = 201) -> Iterator[Namespace]:
    """A namespace named after `tag` and this process, with `clients` addresses (at most 5) on a /29 whose third
    octet comes from the pid (tests running at once take different ones); RuntimeError with `ip`'s words when it
    cannot be made."""
    pid = os.getpid()
    subnet = f"10.{second_octet}.{pid % 200 + 20}"
    name, host_if, ns_if = f"{tag}-{pid}", f"{tag[:4]}h{pid}"[:15], f"{tag[:4]}n{pid}"[:15]
    made = ip("netns", "add", name, check=False)
    if made.returncode != 0:
        raise RuntimeError(f"cannot make a network namespace: {made.stderr.strip()}")
    addresses = tuple(f"{subnet}.{i}" for i in range(2, 2 + min(clients, 5)))
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", name)
        ip("addr", "add", f"{subnet}.1/29", "dev", host_if)
        ip("link", "set", host_if, "up")
        for address in addresses:
            ip("netns", "exec", name, "ip", "addr", "add", f"{address}/29", "dev", ns_if)
        ip("netns", "exec", name, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield Namespace(name, f"{subnet}.1", addresses)
    finally:
        ip("netns", "del", name, check=False)            # takes the veth pair with it
        ip("link", "del", host_if, check=False)
