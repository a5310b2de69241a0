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
    if not re.fullmatch(r"[0-9]{1,5}", port) or not (0 if allow_port_zero else 1) <= int(port) <= 65535:
        raise ValueError("%r: bad port %r" % (text, port))
    return host, int(port)


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
