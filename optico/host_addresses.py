"""The IP addresses a URL's host names without a DNS lookup, in every spelling the resolver takes.

Shared by the checks that keep a URL off a cloud's metadata service or this host (a schedule's webhook,
the LLM endpoint): `0xa9fea9fe`, `169.254.43518` and `0251.0376.0251.0376` are all 169.254.169.254.
"""

from __future__ import annotations

import ipaddress
import re
import socket


def literal_addresses(host: str) -> list[str]:
    """The addresses `host` names without DNS: an IP literal, the legacy IPv4 forms the resolver also
    takes (127.1, 2130706433, 0x7f000001, 017700000001, 0) and localhost; [] for any other name."""
    try:  # as the resolver reads it: 'localhost.' and 'ｌｏｃａｌｈｏｓｔ' (IDNA folds it) are localhost
        host = host.encode("idna").decode("ascii").rstrip(".").lower()
    except UnicodeError:
        host = host.rstrip(".").lower()
    try:
        return [str(ipaddress.ip_address(host.split("%")[0]))]
    except ValueError:
        pass
    if host == "localhost" or host.endswith(".localhost"):
        return ["127.0.0.1"]
    if re.fullmatch(r"[0-9a-fA-FxX.]+", host):
        try:
            return [socket.inet_ntoa(socket.inet_aton(host))]
        except OSError:
            return []
    return []


def is_link_local(address: str) -> bool:
    """A link-local address (169.254.0.0/16, fe80::/10), also inside an IPv4-mapped IPv6 one."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_link_local or (mapped is not None and mapped.is_link_local)
