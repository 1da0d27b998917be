"""Who can reach a listening service: loopback-only binds, and the token any other bind needs.

A service bound to a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``) is reachable
from this machine only; any other bind address (``0.0.0.0``, a pod IP, a host name) may be
reachable from the network, so its privileged routes must not be open (docs/security.md).
"""

from __future__ import annotations

import ipaddress

from rolloutd.errors import ConfigError


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only.

    Args:
        host: a bind address: an IPv4/IPv6 literal (brackets allowed) or a host name.

    Returns:
        True for ``localhost`` and loopback literals; False for anything else, including
        ``0.0.0.0``, ``::``, ``""`` (all interfaces) and other host names (not resolved: a
        name may resolve differently later).
    """
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def require_token_off_loopback(
    host: str, token: str | None, *, service: str, token_setting: str, protects: str
) -> None:
    """Refuse to serve privileged routes without a token on a non-loopback address.

    Args:
        host: the bind address.
        token: the configured token (None or empty: none).
        service: the service's name, for the message (``"the gateway"``).
        token_setting: the variable that sets the token (``"ROLLOUTD_ADMIN_TOKEN"``).
        protects: what the token protects, for the message.

    Raises:
        ConfigError: ``host`` is not loopback and ``token`` is unset.
    """
    if not token and not is_loopback(host):
        raise ConfigError(
            f"{service} would listen on {host!r}, which is not a loopback address, without "
            f"a token: {protects} would be open to the network. Set {token_setting} (a long "
            f"random string, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            f"), or bind 127.0.0.1. See docs/security.md."
        )
