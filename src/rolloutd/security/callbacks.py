"""Signed callbacks: each POST of a session's result to a task's ``callback_url`` carries an
HMAC-SHA256 signature made with the task's own secret, so a receiver can tell rolloutd's
callbacks from anyone else's POSTs and refuse a replayed one.

The scheme is Stripe's webhook signature (docs.stripe.com/webhooks, "Verify signatures
manually"): the header ``X-Rolloutd-Signature: t=<unix seconds>,v1=<hex digest>``, the digest
being ``HMAC-SHA256(secret, f"{t}." + body)`` over the exact body bytes (RFC 2104).
"""

from __future__ import annotations

import hashlib
import hmac
import time

#: the header carrying the signature
SIGNATURE_HEADER = "X-Rolloutd-Signature"
#: how old a signed callback a receiver accepts by default, seconds
DEFAULT_TOLERANCE_S = 300.0


def sign_callback(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header's value for ``body``.

    Args:
        secret: the task's callback secret (``TaskRequest.callback_secret``).
        body: the exact bytes POSTed.
        timestamp: unix seconds (None: now).

    Returns:
        ``t=<timestamp>,v1=<hex HMAC-SHA256>``.
    """
    t = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def verify_callback(
    secret: str,
    body: bytes,
    header: str | None,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """Whether ``header`` is a valid signature of ``body`` made within ``tolerance_s``
    (constant-time comparison); what a receiver calls.

    Args:
        secret: the task's callback secret.
        body: the request's raw body.
        header: the ``X-Rolloutd-Signature`` header's value (None: missing).
        tolerance_s: the oldest signature accepted, seconds (a replayed POST is older).
        now: unix seconds (None: the clock).
    """
    if not header:
        return False
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        t = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance_s:
        return False
    expected = sign_callback(secret, body, t).split(",", 1)[1][3:]
    return hmac.compare_digest(expected, fields.get("v1", ""))
