"""A client's address, which no header it writes can change (service/identity.py), and the rate limit keyed by it."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lensapp import config
from lensapp.service.identity import UNIDENTIFIED, bucket, client_address, is_loopback, scheme, site, turn
from lensapp.service.limits import SITE_SHARE, RateLimited, RateLimiter

addresses = st.ip_addresses().map(str)
# What a client (or a proxy nobody vouches for) may write: anything, names and commas included.
junk = st.one_of(st.text(max_size=40), st.sampled_from(["localhost", "127.0.0.1", "::1", "unknown", "_hidden",
                                                         "10.0.0.1:8080", "[::1]", " 127.0.0.1 ", "1.2.3.4, 5.6.7.8"]))
written = st.lists(st.one_of(junk, addresses), max_size=5).map(", ".join)
# What a trusted proxy writes: one entry, no comma (usually an address; it may be a name or empty).
entry = st.one_of(addresses, junk.filter(lambda s: "," not in s))
peers = st.one_of(addresses, st.none(), junk)


def is_ip(text) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


@given(peer=peers, lines=st.lists(st.one_of(written, st.none()), max_size=3), n=st.integers(0, 4))
@example(peer="10.0.0.5", lines=["localhost"], n=1)
@example(peer="10.0.0.5", lines=["evil.example, 127.0.0.1"], n=1)
def test_any_header_yields_an_ip_address_or_nothing_never_a_name(peer, lines, n):
    got = client_address(peer, lines, n)
    assert got is None or is_ip(got)
    assert got is None or got == client_address(got)         # normalised: the same text every time


@given(peer=peers, client=st.lists(written, min_size=1, max_size=3), proxies=st.lists(entry, min_size=1, max_size=4),
       one_line=st.booleans())
def test_hops_the_client_writes_never_change_the_address(peer, client, proxies, one_line):
    """The trusted proxies' entries are the last len(proxies): whatever the client wrote before them, in the same
    line or in header lines of its own, the derived address is the same as without it."""
    n = len(proxies)
    appended = ", ".join(proxies)
    forged = [", ".join([*client, appended])] if one_line else [*client, appended]
    assert client_address(peer, forged, n) == client_address(peer, [appended], n)


@given(peer=addresses, lines=st.lists(written, max_size=3))
def test_with_no_trusted_proxy_the_header_is_ignored(peer, lines):
    assert client_address(peer, lines, 0) == client_address(peer)


def test_https_is_what_the_outermost_trusted_proxy_wrote_never_what_the_client_did():
    """Whether the visitor cookie must be `Secure; Partitioned` (server.PrefetchLinks): a Space's proxy ends TLS
    and says so in X-Forwarded-Proto; what a client writes there counts for nothing."""
    assert scheme("http") == "http" and scheme("https") == "https" and scheme(None) == "http"
    assert scheme("http", ["https"], 0) == "http"                   # nobody vouches for the header
    assert scheme("http", ["https"], 1) == "https"                  # the trusted proxy saw HTTPS
    assert scheme("http", ["https, http"], 1) == "http"             # the client's "https" left of the proxy's entry
    assert scheme("http", ["https", "http"], 1) == "http"           # in a header line of its own, too
    assert scheme("http", ["HTTPS"], 1) == "https"
    assert scheme("https", ["junk"], 1) == "https" and scheme("http", ["https"], 2) == "http"


def test_the_outermost_trusted_proxys_entry_is_the_client():
    assert client_address("10.0.0.5", ["203.0.113.9"], 1) == "203.0.113.9"
    assert client_address("10.0.0.5", ["1.1.1.1, 203.0.113.9"], 1) == "203.0.113.9"         # a forged first hop
    assert client_address("10.0.0.5", ["198.51.100.7, 203.0.113.9, 10.0.0.9"], 2) == "203.0.113.9"
    assert client_address("10.0.0.5", ["localhost"], 1) == "10.0.0.5"                       # a name: the peer
    assert client_address("10.0.0.5", ["203.0.113.9"], 2) == "10.0.0.5"                     # fewer than trusted
    assert client_address("10.0.0.5", [], 1) == "10.0.0.5"
    assert client_address("8.8.8.8", ["1.2.3.4"], 0) == "8.8.8.8"
    assert client_address("::ffff:203.0.113.9") == "203.0.113.9"                           # IPv4 mapped in IPv6
    assert client_address("testclient") is None


def test_no_name_is_loopback_and_ipv6_counts_by_its_56_and_its_48():
    assert is_loopback("127.0.0.1") and is_loopback("127.8.0.1") and is_loopback("::1")
    assert not any(map(is_loopback, ["localhost", "LOCALHOST", "127.0.0.1 ", "0x7f000001", "", None, "10.0.0.1"]))
    assert bucket("2001:db8:1:2:aaaa::1") == bucket("2001:db8:1:2f:bbbb::9") == "2001:db8:1::/56"
    assert bucket("2001:db8:1:100::1") != bucket("2001:db8:1:2::1")
    assert site("2001:db8:1:100::1") == site("2001:db8:1:2::1") == "2001:db8:1::/48"
    assert turn("2001:db8:1:100::1") == turn("2001:db8:1:ff00::7") == "2001:db8:1::/48"      # one site, one turn
    assert site("203.0.113.9") is None and turn("203.0.113.9") == "203.0.113.9"
    assert bucket("203.0.113.9") == "203.0.113.9" and bucket("what") == bucket(None) == UNIDENTIFIED


def test_the_limit_holds_for_names_and_a_whole_ipv6_56():
    limiter = RateLimiter(per_minute=60, burst=2, clock=lambda: 0.0)
    for client in ("localhost", "2001:db8::1", "unknown"):
        with pytest.raises(RateLimited):
            for _ in range(3):
                limiter.check(client)
    with pytest.raises(RateLimited):                          # another address of the same /56: the same bucket
        limiter.check("2001:db8:0:ff::ffff")
    with pytest.raises(RateLimited):                          # every unidentified peer shares one bucket
        limiter.check("something else")
    for _ in range(10):
        limiter.check("127.0.0.1")
        limiter.check(None)                                   # a call from inside the app


def test_a_48_cannot_outnumber_the_room():
    """Every /56 of a /48 is a client of its own, but together they get SITE_SHARE clients' worth, not 256."""
    limiter = RateLimiter(per_minute=60, burst=2, clock=lambda: 0.0)
    allowed = 0
    for i in range(256):                                      # a fresh /56 for every request
        try:
            limiter.check(f"2001:db8:7:{i:02x}00::1")
            allowed += 1
        except RateLimited:
            pass
    assert allowed == 2 * SITE_SHARE
    limiter.check("2001:db8:8::1")                            # the next /48 is another site


def test_trusted_proxies_is_1_on_a_space_and_0_elsewhere(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert config.resolve_trusted_proxies(config.WebSettings()) == 0
    monkeypatch.setenv("SPACE_ID", "someone/lens-explorer")
    assert config.resolve_trusted_proxies(config.WebSettings()) == 1
    assert config.resolve_trusted_proxies(config.from_args(environ={"LENSAPP_TRUSTED_PROXIES": "2"}).web) == 2
    assert config.resolve_trusted_proxies(config.WebSettings(trusted_proxies="0")) == 0
    for bad in ("-1", "many", "9", " 1"):
        with pytest.raises(config.ConfigError, match="trusted_proxies"):
            config.Config.of(trusted_proxies=bad)
