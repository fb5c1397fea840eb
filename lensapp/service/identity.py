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
the people behind an address apart (`Asker`): a *person* is a browser that loaded the page. The page's answer sets a
visitor cookie (`new_visitor`: a random id and its HMAC under a secret of this process, so no client can make one
up; `server.PrefetchLinks` sets it, HttpOnly), and the browser sends it with each of its page's requests (Gradio's
queue joins included), so its very first request is a person's: requests, four at once, an engine turn and a work
budget of their own. Thirty people new to the app who click within a few seconds are thirty visitors. A login in a
browser is that login in that browser: a class given one participant login is still a class. Everything that carries
no valid cookie (gradio_client, curl, a script, however many session hashes it takes) is its address, whose share
all of it splits; a login without a cookie is the login's. A session hash is the client's own choice and names
nobody.

A script can load the page for cookies as a browser does, so what cookies bring is bounded per address (an IPv6
/48, as `turn`): an address is given NEW_VISITORS cookies at once, then one every NEW_VISITOR_SECONDS /
NEW_VISITORS (a room arrives at once; a reload keeps its cookie), and at most ROOM_PEOPLE visitors are seated: while
they are, a newcomer takes the place of one unseen for IDLE_SECONDS, or stays the address; one unseen for
STANDING_SECONDS is forgotten. A visitor given a place again keeps their buckets (they are
the cookie's), so only a new cookie brings a fresh budget. The secret dies with the process: after a restart a page
is its address until it is loaded again.

Behind an HTTPS front (the request's scheme, or the X-Forwarded-Proto a trusted proxy wrote: `scheme`) the cookie
is `SameSite=None; Secure; Partitioned`, so a Space's page, framed by huggingface.co, keeps it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Iterable

from cachetools import LRUCache

from ..config import is_loopback_host
from .buckets import Bucket, Rate

IPV6_PREFIX = 56          # one client
IPV6_SITE = 48            # one site: at most limits.SITE_SHARE clients' worth, one turn
UNIDENTIFIED = "unidentified"
IDLE_SECONDS = 120.0      # a visitor unseen this long gives their place to a newcomer while the room is full
STANDING_SECONDS = 1800.0 # a visitor unseen this long is forgotten: a workshop's exercises are minutes apart
ROOM_PEOPLE = 40          # visitors seated behind one address at most (a classroom); the rest share the address
NEW_VISITORS = ROOM_PEOPLE            # visitor cookies an address is given at once (a room loading the page)...
NEW_VISITOR_SECONDS = 600.0           # ... and as many again over this long
NEW_VISITOR_RATE = Rate(NEW_VISITORS / NEW_VISITOR_SECONDS, float(NEW_VISITORS))
ROOMS = 4096              # addresses whose people are remembered, the least recently seen forgotten first
VISITOR_COOKIE = "lensapp_visitor"


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


def scheme(scheme: str | None, forwarded_proto: Iterable[str | None] = (), trusted_proxies: int = 0) -> str:
    """The scheme the client used: what the outermost of `trusted_proxies` proxies wrote in X-Forwarded-Proto
    (`forwarded_proto`: every line, in order), else the request's own ("http" for anything but "https")."""
    if trusted_proxies > 0:
        entries = [e.strip().lower() for line in forwarded_proto if line for e in line.split(",")]
        if len(entries) >= trusted_proxies and entries[-trusted_proxies] in ("http", "https"):
            return entries[-trusted_proxies]
    return "https" if scheme == "https" else "http"


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
    key, a visitor's or a login's, hashed): their requests, admission, engine turn and work budget are theirs."""

    address: str | None
    person: str | None = None


class People:
    """The people told apart behind each address (thread-safe): the browsers that loaded the page, each by the
    signed visitor cookie the page's answer gave it (`new_visitor`), and logins."""

    def __init__(self, clock=time.monotonic, most: int = ROOM_PEOPLE, secret: bytes | None = None):
        self.clock, self.most = clock, most
        self._secret = secret if secret is not None else secrets.token_bytes(32)   # this process's alone
        self._rooms: LRUCache = LRUCache(ROOMS)       # turn(address) -> {person key: [first seen, last seen]}
        self._minted: LRUCache = LRUCache(ROOMS)      # turn(address) -> the Bucket of cookies it may still be given
        self._lock = threading.Lock()

    def new_visitor(self, address: str | None) -> str | None:
        """A visitor cookie's value for a browser loading the page from `address` without a valid one: a random id
        and its HMAC under this process's secret, so no client can make one up. None (the browser stays its
        address) when the address was given NEW_VISITORS lately: a script loading the page for cookies gets a
        room's worth, then one every NEW_VISITOR_SECONDS / NEW_VISITORS."""
        if address is not None:
            with self._lock:
                now = self.clock()
                minted = self._minted.get(turn(address))
                if minted is None:
                    minted = self._minted.setdefault(turn(address), Bucket(NEW_VISITOR_RATE, 1, now))
                minted.refill(now)
                if minted.tokens < 1.0:
                    return None
                minted.take(1.0)
        visitor = secrets.token_urlsafe(12)
        return f"{visitor}.{self._sign(visitor)}"

    def visitor(self, cookie: str | None) -> str | None:
        """The visitor id `cookie` names, if this process signed it; None for anything else."""
        if not isinstance(cookie, str) or len(cookie) > 128:
            return None
        visitor, _, mac = cookie.partition(".")
        return visitor if visitor and hmac.compare_digest(mac, self._sign(visitor)) else None

    def who(self, address: str | None, cookie: str | None = None, login: str | None = None) -> Asker:
        """Who a request from `address` carrying this visitor `cookie` and `login` (Gradio's username) is: the
        browser (with a login, the login in that browser) while the address's room has its place; else the login;
        else the address."""
        if address is None:
            return Asker(None)
        visitor = self.visitor(cookie)
        if visitor is not None:
            key = _key("login", f"{login}\n{visitor}") if login else _key("visitor", visitor)
            if self._seated(address, key):
                return Asker(address, key)
        if login:
            return Asker(address, _key("login", login))
        return Asker(address)

    def count(self, address: str | None) -> int:
        """Visitors seated behind `address` (a login without a cookie is a person without being kept here)."""
        with self._lock:
            return len(self._rooms.get(turn(address), {}))

    def _sign(self, visitor: str) -> str:
        return hmac.new(self._secret, visitor.encode(), hashlib.sha256).hexdigest()[:32]

    def _seated(self, address: str, key: str) -> bool:
        """Whether `key` has a place in `address`'s room, seen now: kept, or given one (`_place`)."""
        with self._lock:
            room = self._rooms.get(turn(address))
            if room is None:
                room = self._rooms.setdefault(turn(address), {})
            now = self.clock()
            if key in room:
                room[key][1] = now
                return True
            if self._place(room, now):
                room[key] = [now, now]
                return True
            return False

    def _place(self, room: dict, now: float) -> bool:
        """Whether `room` has a place for one more, once the forgotten are gone (the lock held)."""
        for key in [k for k, (_, last) in room.items() if now - last > STANDING_SECONDS]:
            del room[key]
        if len(room) < self.most:
            return True
        key, (_, last) = min(room.items(), key=lambda item: item[1][1])
        if now - last < IDLE_SECONDS:
            return False
        del room[key]
        return True


def _key(kind: str, name: str) -> str:
    """A short key for a visitor or a login: neither a login's name nor a visitor id is kept or shown."""
    return hashlib.blake2b(f"{kind}:{name}".encode(), digest_size=8).hexdigest()
