"""Who a request comes from: an IP address no client can choose, for the rate limit and the host's views.

The peer (the TCP connection's other end) is the client unless the host says proxies stand in front
(`trusted_proxies`, `config.py`: 1 on a Hugging Face Space, 0 elsewhere). Each proxy appends the
address it received the connection from to X-Forwarded-For, so the entry `trusted_proxies` from the
right was written by the outermost trusted proxy: the address it saw, which the client cannot choose.
Everything to its left was written by the client (or by proxies nobody vouches for) and is ignored,
however many hops it claims. Only an IP address counts: a name ("localhost"), an obfuscated
identifier ("_hidden", "unknown") or junk in that slot, or fewer entries than trusted proxies, mean
the peer is used instead.

IPv6 clients are counted by their /56 (`bucket`): one host usually holds a whole /64, and one customer a
/56 or a /48, so it could otherwise take a fresh address for every request. A /48 (`site`) holds 256 /56s:
the rate limit caps what a whole /48 may ask for besides (`limits.SITE_SHARE`), and the engine's fair turns
count a /48 as one party (`turn`), so one site cannot outnumber the room. An IPv4 address mapped into IPv6 is
the IPv4 one.

Behind one address there may be a room: a classroom's wifi reaches a Space through one NAT address. `People` tells
the people behind an address apart where it can (`Asker`): a login names one at once; a browser's session (Gradio's
session hash, which the page keeps while it is open) names one once a request of it was let in as the address's. A
session hash is the client's own choice, and a new one on any request makes a new Gradio session, so a session seen
once adds nothing: a script that takes a fresh session for every request stays its address, all of whose requests
it shares. A known session has requests and a turn of its own at once (a page's first load asks five times in a
second or two); its engine work is the address's until it has *earned standing*, EARN_SECONDS after it was let in,
so a session's first moments cannot bring a fresh work budget. At most ROOM_PEOPLE sessions per address (an IPv6 /48,
as `turn`) are known: while they are, a newcomer takes the place of one seen only once (a rotating script's never
push out people who come back), else of one unseen for IDLE_SECONDS, or stays the address; a session unseen for
STANDING_SECONDS is forgotten.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import threading
import time
from dataclasses import dataclass
from typing import Iterable

from cachetools import LRUCache

from ..config import is_loopback_host

IPV6_PREFIX = 56          # one client
IPV6_SITE = 48            # one site: at most limits.SITE_SHARE clients' worth, one turn
UNIDENTIFIED = "unidentified"
EARN_SECONDS = 5.0        # a known session's work is its own this long after its first request was let in
IDLE_SECONDS = 120.0      # a known session unseen this long gives its place to a newcomer while the room is full
STANDING_SECONDS = 1800.0 # a known session unseen this long is forgotten: a workshop's exercises are minutes apart
ROOM_PEOPLE = 40          # sessions known behind one address at most (a classroom); the rest share the address
ROOMS = 4096              # addresses whose people are remembered, the least recently seen forgotten first
SESSION = re.compile(r"[A-Za-z0-9_-]{1,64}")   # a session hash as Gradio's page makes one; anything else is nobody


def client_address(peer: str | None, forwarded: Iterable[str | None] = (), trusted_proxies: int = 0) -> str | None:
    """The client's address: the IP the outermost of `trusted_proxies` proxies saw, else the peer's.

    forwarded: every X-Forwarded-For header line, in order (a client may send its own; proxies append).
    Returns a normalised IP address, or None when neither the header's slot nor the peer is one.
    """
    if trusted_proxies > 0:
        entries = [e.strip() for line in forwarded if line for e in line.split(",")]
        if len(entries) >= trusted_proxies:
            address = ip(entries[-trusted_proxies])
            if address is not None:
                return address
    return ip(peer)


def ip(text: str | None) -> str | None:
    """`text` as a normalised IP address (an IPv4-mapped IPv6 one as IPv4), or None if it is not one."""
    if not isinstance(text, str) or not text or len(text) > 64:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped if mapped is not None else address)


def is_loopback(address: str | None) -> bool:
    """A connection from this machine: an IP address (an IPv4-mapped one as IPv4) that `config.is_loopback_host`,
    the one loopback rule, says is this machine's (127.0.0.0/8, ::1). A name ("localhost", which that rule counts
    as a host to listen on or connect to) is no address: no client's address is one."""
    address = ip(address)
    return address is not None and is_loopback_host(address)


def bucket(address: str | None) -> str:
    """What the rate limit counts `address` as: itself, an IPv6 address's /56, or (not an IP: a peer the
    app cannot name, such as a UNIX socket's) one bucket that all of those share."""
    return _network(address, IPV6_PREFIX)


def site(address: str | None) -> str | None:
    """The IPv6 /48 `address` belongs to, which the rate limit caps as a whole; None for anything else (an IPv4
    address is one client and one site)."""
    if ip(address) is None or ipaddress.ip_address(ip(address)).version != 6:
        return None
    return _network(address, IPV6_SITE)


def turn(address: str | None) -> str:
    """Whose turn `address` waits in (engine/run/turns.py): an IPv4 address, an IPv6 address's /48."""
    return site(address) or bucket(address)


def _network(address: str | None, prefix: int) -> str:
    if ip(address) is None:
        return UNIDENTIFIED
    parsed = ipaddress.ip_address(ip(address))
    if parsed.version == 6:
        host_bits = 128 - prefix
        return str(ipaddress.IPv6Network((int(parsed) >> host_bits << host_bits, prefix)))
    return str(parsed)


@dataclass(frozen=True)
class Asker:
    """Who asks: an address (None: the app itself) and, where one is told apart, the person behind it (an opaque
    key, a login's or a session's, hashed: the requests, admission and engine turn are theirs; the engine work too
    once `earned`, else the address's). `session`: the key of a session not yet known, known once let in."""

    address: str | None
    person: str | None = None
    earned: bool = False
    session: str | None = None


class People:
    """The people told apart behind each address (thread-safe): logins, and sessions made known by `known`."""

    def __init__(self, clock=time.monotonic, most: int = ROOM_PEOPLE):
        self.clock, self.most = clock, most
        self._rooms: LRUCache = LRUCache(ROOMS)       # turn(address) -> {session key: [first let in, last seen]}
        self._lock = threading.Lock()

    def who(self, address: str | None, session: str | None = None, login: str | None = None) -> Asker:
        """Who a request from `address` with this Gradio `session` hash and `login` (Gradio's username) is."""
        if address is None:
            return Asker(None)
        if login:
            return Asker(address, _key("login", login), earned=True)
        if not isinstance(session, str) or not SESSION.fullmatch(session):
            return Asker(address)
        key = _key("session", session)
        with self._lock:
            seen = self._rooms.get(turn(address), {}).get(key)
            if seen is None:
                return Asker(address, session=key)
            now = seen[1] = self.clock()
            return Asker(address, key, earned=now - seen[0] >= EARN_SECONDS)

    def known(self, asker: Asker) -> None:
        """`asker`'s request was let in as its address's: its session is known from now, if the room has a place
        (or one unseen for IDLE_SECONDS to give)."""
        if asker.session is None or asker.address is None:
            return
        with self._lock:
            room = self._rooms.get(turn(asker.address))
            if room is None:
                room = self._rooms.setdefault(turn(asker.address), {})
            now = self.clock()
            if asker.session not in room and self._place(room, now):
                room[asker.session] = [now, now]

    def count(self, address: str | None) -> int:
        """Sessions known behind `address` (a login is a person without being kept here)."""
        with self._lock:
            return len(self._rooms.get(turn(address), {}))

    def _place(self, room: dict, now: float) -> bool:
        """Whether `room` has a place for one more, once the forgotten are gone (the lock held)."""
        for key in [k for k, (_, last) in room.items() if now - last > STANDING_SECONDS]:
            del room[key]
        if len(room) < self.most:
            return True
        # Seen once only: a script's rotating sessions (or a page that never came back) give way first, so they
        # never push out the people who keep coming back.
        once = [(first, k) for k, (first, last) in room.items() if first == last]
        if once:
            del room[min(once)[1]]
            return True
        key, (_, last) = min(room.items(), key=lambda item: item[1][1])
        if now - last < IDLE_SECONDS:
            return False
        del room[key]
        return True


def _key(kind: str, name: str) -> str:
    """A short key for a login or a session: neither a login's name nor a session hash is kept or shown."""
    return hashlib.blake2b(f"{kind}:{name}".encode(), digest_size=8).hexdigest()
