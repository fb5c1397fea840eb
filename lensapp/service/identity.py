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
"""

from __future__ import annotations

import ipaddress
from typing import Iterable

from ..config import is_loopback_host

IPV6_PREFIX = 56          # one client
IPV6_SITE = 48            # one site: at most limits.SITE_SHARE clients' worth, one turn
UNIDENTIFIED = "unidentified"


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
