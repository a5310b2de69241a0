"""addresses.py: host:port text and IP literals, parsed and formatted in one place.

A leaf (the standard library only): the command line, outbound.py's dialer and
webtunnel's ``addr=`` all read an address with the same rules.
"""

import ipaddress
import re


def parse_address(text, allow_port_zero=False):
    """'192.0.2.1:80', '[2001:db8::1]:80' or 'example.org:80' -> (host, port).

    The host is never empty ('[]:80' is refused) and brackets only enclose a whole
    host; the port is 1..65535 (0 too if allowed) in ASCII digits: str.isdigit() and
    int() also take other scripts' digits ('127.0.0.1:١٠٥٠' was port 1050)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError("%r is not HOST:PORT" % text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            raise ValueError("%r: empty host" % text)
    elif ":" in host:
        raise ValueError("%r: write IPv6 addresses as [ADDRESS]:PORT" % text)
    if "[" in host or "]" in host:
        raise ValueError("%r: brackets go around a whole IPv6 address: [ADDRESS]:PORT" % text)
    problem = _host_problem(host, bracketed=text.startswith("["))
    if problem:
        raise ValueError("%r: %s" % (text, problem))
    if not re.fullmatch(r"[0-9]{1,5}", port) or not (0 if allow_port_zero else 1) <= int(port) <= 65535:
        raise ValueError("%r: bad port %r" % (text, port))
    return host, int(port)


def _host_problem(host, bracketed):
    """Why ``host`` (from HOST:PORT) can be no host, or None. A host name or
    an IPv4 literal has no control character, space or ``%``; a bracketed
    host is an IPv6 literal, with a zone (``fe80::1%eth0``) if any. What this
    lets through is still checked by name resolution (and by outbound.py
    before it goes into a proxy request); this keeps a line break or a space
    out of every message and log line that shows an address."""
    if any(not char.isprintable() or char.isspace() for char in host):
        return "a host has no control character or space"
    if bracketed:
        address, _, zone = host.partition("%")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return "only an IPv6 address goes in brackets"
        if "%" in host and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", zone):
            return "an IPv6 zone is an interface name or number"
    elif "%" in host:
        return "a host has no % (an IPv6 zone goes inside the brackets)"
    return None


def format_address(address):
    host, port = address[0], address[1]
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def is_ip_literal(host):
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
