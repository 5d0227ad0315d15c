"""Checking that a webhook came from the fleet."""

from __future__ import annotations

import hashlib
import hmac
from typing import Mapping, Union

__all__ = ["SIGNATURE_HEADER", "EVENT_HEADER", "verify_webhook"]

#: The header that carries the signature: ``sha256=<hex HMAC-SHA256 of the body>``.
SIGNATURE_HEADER = "X-Fleetrun-Signature"
#: The header that carries the event's routing key (``job.completed``, ``job.failed``, ...).
EVENT_HEADER = "X-Fleetrun-Event"


def verify_webhook(
    body: bytes,
    headers: Mapping[str, str],
    secret: Union[str, bytes],
) -> bool:
    """Whether a webhook POST was signed by the fleet with ``secret``.

    The fleet signs a job's webhook (its ``notify_url``) with the secret in
    ``FLEETRUN_WEBHOOK_SECRET`` of the process that ends the job: the header
    ``X-Fleetrun-Signature: sha256=<hex>`` holds the HMAC-SHA256 of the exact body. Pass
    the body's bytes as received (not re-encoded JSON) and the request's headers (any
    mapping; the header's name is matched in any case). The comparison takes the same time
    whatever the signature, and a missing or malformed header is ``False``.

    >>> import hmac, hashlib
    >>> body = b'{"job_id": "j1", "state": "Completed"}'
    >>> sig = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    >>> verify_webhook(body, {"X-Fleetrun-Signature": sig}, "s3cret")
    True
    >>> verify_webhook(body + b" ", {"X-Fleetrun-Signature": sig}, "s3cret")
    False
    """
    given = None
    wanted = SIGNATURE_HEADER.lower()
    for name, value in headers.items():
        if name.lower() == wanted:
            given = value
            break
    if not isinstance(given, str) or not given.startswith("sha256="):
        return False
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    expected = "sha256=" + hmac.new(key, bytes(body), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode("ascii"), given.strip().encode("ascii", "replace"))
