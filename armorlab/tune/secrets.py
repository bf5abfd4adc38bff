"""Passwords in storage URLs: never shown, never stored (torch- and optuna-free).

A study's storage URL (``--storage`` or ``search.storage``) is written to ``.tune/study.json``
and the spec copy, printed by ``tune``/``tune --status`` and in the ``dashboard:`` line, and
quoted in errors. A literal password in it (``postgresql://me:s3cret@host/db``, or libpq's
``?password=s3cret``) is taken out before any of that: armorlab keeps the URL without it and
hands the password to the database driver, and to the study's workers through ``PGPASSWORD``
(libpq reads it, and ``~/.pgpass``, when a URL has no password). A URL may also name it as
``$VAR`` (expanded from the environment when the database is opened; the stored URL keeps
``$VAR``).

A password holding ``@``, ``/`` or ``?`` unencoded is read as far as the ``@`` before the host
(the first ``@`` followed by a host and a path without ``@``: ``me:p@s/s@host/db`` → password
``p@s/s``), so it is neither shown nor mistaken for a host or port.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, unquote, urlencode

MASK = "***"
_HOST = re.compile(r"[^@/?#]*")  # host[:port] up to the path or query


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password decoded, or None when it has none)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None
    password = None
    colon = rest.find(":")
    user = rest[:colon] if colon >= 0 else ""
    if colon >= 0 and not any(c in user for c in "@/?#"):
        at = colon
        while True:
            at = rest.find("@", at + 1)
            if at < 0:
                break
            host = _HOST.match(rest, at + 1).group()
            path = rest[at + 1 + len(host):].partition("?")[0]
            if path[:1] in ("", "/", "#") and "@" not in path:  # the host, then a path without '@'
                password = unquote(rest[colon + 1:at])
                rest = f"{user}{rest[at:]}"
                break
    base, qsep, query = rest.partition("?")
    if qsep:
        items = parse_qsl(query, keep_blank_values=True)
        secret = [v for k, v in items if k == "password"]
        if secret:
            password = password or secret[-1]
            kept = [(k, v) for k, v in items if k != "password"]
            rest = base + (f"?{urlencode(kept, safe='/:$')}" if kept else "")
    return f"{scheme}{sep}{rest}", password


def redact(url: str) -> str:
    """The URL as it may be shown: its password replaced by ``***``."""
    clean, password = split_password(url)
    if password is None:
        return url
    scheme, sep, rest = clean.partition("://")
    at = rest.find("@")
    if at >= 0 and not any(c in rest[:at] for c in "/?#"):
        return f"{scheme}{sep}{rest[:at]}:{MASK}{rest[at:]}"
    return f"{clean}{'&' if '?' in clean else '?'}password={MASK}"


def scrub(text: str, *urls: str | None) -> str:
    """``text`` (an error message) with every form of the URLs' passwords masked."""
    for url in urls:
        if not url:
            continue
        _, password = split_password(url)
        if password:
            for form in sorted({password, quote(password, safe=""), quote(password)}, key=len, reverse=True):
                text = text.replace(form, MASK)
    return text


# The passwords taken out of URLs this process was given, by the URL as stored: kept in memory
# only, for this process's own connections and the environment of the workers it starts.
_PASSWORDS: dict[str, str] = {}


def remember(clean_url: str, password: str) -> None:
    _PASSWORDS[clean_url] = password


def recall(url: str | None) -> str | None:
    """The password taken out of the stored ``url`` by this process, if any."""
    return _PASSWORDS.get(url) if url else None


def worker_env(url: str | None) -> dict[str, str]:
    """What a worker process needs in its environment to open ``url``: ``PGPASSWORD`` when this
    process holds the password (libpq reads it; nothing is written to a file)."""
    password = recall(url)
    return {"PGPASSWORD": password} if password is not None else {}
