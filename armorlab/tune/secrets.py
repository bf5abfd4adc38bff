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
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

MASK = "***"
_HOST = re.compile(r"[^@/?#]*")  # host[:port] up to the path or query
# query arguments that hold a secret, in any case (libpq's own names are lower case; an upper-case
# one is an error to libpq but was still typed by someone, with their password in it)
SECRET_KEYS = ("password", "sslpassword")


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password decoded, or None when it has none).

    The user may hold ``@`` too (``user@server:password@host``, as Azure names users): its ``@``
    is written ``%40`` in the URL returned. SQLAlchemy's ``make_url`` is not used for this part:
    it ends a password at its first ``@`` (``me:p@ss@h`` → password ``p``, host ``ss@h``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None
    password = None
    colon = rest.find(":")
    user = rest[:colon] if colon >= 0 else ""
    if colon >= 0 and not any(c in user for c in "/?#"):
        at = colon
        while True:
            at = rest.find("@", at + 1)
            if at < 0 or ("@" in user and any(c in rest[colon:at] for c in "/?#")):
                break  # a user with '@' and no password: that '@' is in the path or query
            host = _HOST.match(rest, at + 1).group()
            path = rest[at + 1 + len(host):].partition("?")[0]
            if path[:1] in ("", "/", "#") and "@" not in path:  # the host, then a path without '@'
                password = unquote(rest[colon + 1:at])
                rest = f"{user.replace('@', '%40')}{rest[at:]}"
                break
    base, qsep, query = rest.partition("?")
    if qsep:
        items = parse_qsl(query, keep_blank_values=True)
        secret = [v for k, v in items if k.lower() == "password"]
        if secret:
            password = password or secret[-1]
            kept = [(k, v) for k, v in items if k.lower() != "password"]
            rest = base + (f"?{urlencode(kept, safe='/:$')}" if kept else "")
    return f"{scheme}{sep}{rest}", password


def ssl_password(url: str) -> str | None:
    """The literal ``sslpassword`` (the client key's passphrase) a URL's query holds, if any."""
    query = url.partition("://")[2].partition("?")[2]
    found = [v for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() == "sslpassword"]
    return found[-1] if found else None


def conninfo_pairs(text: str) -> list[tuple[str, str]] | None:
    """libpq's keyword/value connection string (``host=h password='a b'``) as (keyword, value)
    pairs, by libpq's rules: ``keyword = value`` with optional spaces around ``=``; a value is
    single-quoted (``\\'`` and ``\\\\`` escaped) or runs to the next space (backslash escapes
    too). None when ``text`` is not one."""
    pairs, i, n = [], 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return pairs or None
        m = _KEYWORD.match(text, i)
        if not m:
            return None
        i, buf = m.end(), []
        quoted = i < n and text[i] == "'"
        i += quoted
        while i < n and (text[i] != "'" if quoted else not text[i].isspace()):
            if text[i] == "\\" and i + 1 < n:
                i += 1
            buf.append(text[i])
            i += 1
        i += quoted  # an unterminated quote: the value runs to the end (libpq refuses it; it is still masked)
        pairs.append((m.group(1), "".join(buf)))


_KEYWORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*")


def _conninfo_value(v: str) -> str:
    return v if v and not any(c.isspace() or c in "'\\" for c in v) else \
        "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def redact(url: str) -> str:
    """The URL as it may be shown: every secret in it replaced by ``***`` (its password in the
    user part or the query, ``sslpassword``, in any case); a libpq ``key=value`` string's too, and
    a string that is neither but names a password is masked whole."""
    if "://" not in url:
        pairs = conninfo_pairs(url)
        if pairs is None:
            return MASK if "password" in url.lower() else url
        return " ".join(f"{k}={MASK if k.lower() in SECRET_KEYS else _conninfo_value(v)}" for k, v in pairs)
    clean, password = split_password(url)
    if ssl_password(clean) is not None:
        base, _, query = clean.partition("?")
        items = [(k, MASK if k.lower() in SECRET_KEYS else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        clean = f"{base}?{urlencode(items, safe='/:$*')}"
    if password is None:
        return clean  # the URL itself, or with its sslpassword masked
    scheme, sep, rest = clean.partition("://")
    at = rest.find("@")
    if at >= 0 and not any(c in rest[:at] for c in "/?#"):
        return f"{scheme}{sep}{rest[:at]}:{MASK}{rest[at:]}"
    return f"{clean}{'&' if '?' in clean else '?'}password={MASK}"


def redact_value(value: Any) -> Any:
    """A value of the wrong type where a URL was expected (a mapping, a list), as it may be shown:
    its strings redacted, and whatever sits under a key naming a password masked."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: MASK if isinstance(k, str) and "password" in k.lower() else redact_value(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


def secrets_of(url: str) -> list[str]:
    """Every secret a URL or libpq string holds, as written and decoded."""
    if "://" not in url:
        pairs = conninfo_pairs(url) or []
        found = [v for k, v in pairs if k.lower() in SECRET_KEYS]
    else:
        found = [split_password(url)[1], ssl_password(url)]
    return [f for f in found if f]


def scrub(text: str, *urls: str | None) -> str:
    """``text`` (an error message) with every form of the URLs' secrets masked."""
    for url in urls:
        if not url:
            continue
        for secret in secrets_of(url):
            for form in sorted({secret, quote(secret, safe=""), quote(secret)}, key=len, reverse=True):
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
