"""The service's API key: read from ``--api-key-file`` and checked for strength at start-up.

A key guards writes (and, with ``--keyed-reads``, everything but ``/healthz``), so a short or
guessable one is refused before the server starts, never accepted silently. The key is sent in the
``X-API-Key`` header, so it must be characters a header carries: visible ASCII (spaces inside allowed).

A browser cannot add that header to the pages it opens, so reads (the search page at ``/`` and what it calls) also
take the key as the password of HTTP Basic authentication, any user name: the page answers a request without it with
a Basic challenge, the browser asks for the key once and sends it with every request to the service after that.
Writes take the key from ``X-API-Key`` alone (credentials a browser adds by itself are never enough to change the
index).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from twotower.errors import TwoTowerError
from twotower.io import read_input_text

API_KEY_HEADER = "X-API-Key"
BASIC_REALM = "twotower search"
BASIC_CHALLENGE = f'Basic realm="{BASIC_REALM}", charset="UTF-8"'
MIN_API_KEY_CHARS = 16
KEY_HINT = "e.g. `openssl rand -hex 24 > api.key` makes a 48-character key"


def check_api_key(key: str, where: str = "api_key") -> str:
    """``key`` if it is strong enough; else a TwoTowerError naming ``where`` (the option and file)."""
    if not key or not key.strip():
        raise TwoTowerError(f"{where}: the API key is empty; write one key of at least {MIN_API_KEY_CHARS} "
                            f"characters on its first line ({KEY_HINT})")
    if len(key) < MIN_API_KEY_CHARS:
        raise TwoTowerError(f"{where}: the API key is {len(key)} characters long; it must have at least "
                            f"{MIN_API_KEY_CHARS} ({KEY_HINT})")
    bad = [i for i, c in enumerate(key) if not " " <= c <= "~"]
    if bad:  # positions only: the key itself is never echoed
        raise TwoTowerError(f"{where}: the API key holds {len(bad)} character(s) outside visible ASCII (the first at "
                            f"position {bad[0] + 1}), which an HTTP header ({API_KEY_HEADER}) cannot carry reliably; "
                            f"use visible ASCII characters only ({KEY_HINT})")
    return key


def read_api_key(path: str | Path) -> str:
    """The API key in ``path`` (first line, stripped), checked by :func:`check_api_key`."""
    path = Path(path)
    where = f"--api-key-file {path}"
    # a regular file of at most 64 KiB (never /dev/zero or a FIFO), UTF-8 with or without a byte-order mark
    lines = read_input_text(path, "--api-key-file", limit=64 * 1024, what="API key file").strip().splitlines()
    return check_api_key(lines[0].strip() if lines else "", where)


def basic_password(authorization: str | None) -> str | None:
    """The password in an ``Authorization: Basic ...`` header (base64 of ``user:password``; the user name is
    ignored), or None: no header, another scheme, or one that does not decode."""
    scheme, _, param = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user_password = base64.b64decode(param.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    user, colon, password = user_password.partition(":")
    return password if colon else None
