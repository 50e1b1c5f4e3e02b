"""Credentials never leave the process: one function removes passwords from URLs in any text.

Every writer of a storage URL (run.json, tuned_config.toml provenance, report.md, the terminal,
logs, the dashboard server) passes its text through `redact`. It works on free text, not just on
a URL on its own, because exception messages from database drivers quote the URL inside a
sentence. See docs/run-safety.md.
"""

from __future__ import annotations

import logging
import re

MASK = "***"

# scheme://user:password@host  ->  scheme://user:***@host. The password runs up to the last "@"
# before the host part ends (passwords may contain "@" when not escaped), never past a space,
# quote or "/" that starts the path.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"<>]*):(?P<password>[^\s'\"<>/]*)@(?P<host>[^\s@'\"<>/]*(?:[/\s'\"<>]|$))"
)
# Query-string secrets (?password=..., &sslpassword=...) in the same URLs.
SECRET_QUERY_KEYS = ("password", "sslpassword", "passwd", "pwd")
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&](?:password|sslpassword|passwd|pwd)=)(?P<value>[^&\s'\"<>]*)", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by ``***``.

    >>> redact("cannot open postgresql://me:s3cret@db:5432/optuna: refused")
    'cannot open postgresql://me:***@db:5432/optuna: refused'
    """
    if "://" not in text and "password" not in text.lower():
        return text
    # The password part may itself contain "@": take the greediest split that still leaves a host.
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{MASK}@{m.group('host')}", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m.group('key')}{MASK}", text)


def password_of(url: str) -> str | None:
    """The password a URL carries, or None (parsed by SQLAlchemy, which unescapes %40 etc.)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:
        return None


def without_password(url: str) -> str:
    """`url` with its password removed entirely (not masked): safe to store, and still a URL that
    connects when the password comes from elsewhere (libpq's PGPASSWORD or ~/.pgpass)."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return redact(url)
    # A password may also ride in the query string (?password=..., libpq's sslpassword): dropped too.
    query = {k: v for k, v in parsed.query.items() if k.lower() not in SECRET_QUERY_KEYS}
    if parsed.password is None and query == dict(parsed.query):
        return url
    # URL.set(password=None) means "unchanged"; build the URL again without it.
    from sqlalchemy.engine import URL

    bare = URL.create(parsed.drivername, parsed.username, None, parsed.host, parsed.port, parsed.database, query)
    return bare.render_as_string(hide_password=False)


def with_password(url: str, password: str | None) -> str:
    """`url` with `password` put back (for connecting only; never write the result anywhere)."""
    if password is None:
        return url
    from sqlalchemy.engine import make_url

    return make_url(url).set(password=password).render_as_string(hide_password=False)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record's message (installed on the CLI's handler,
    so that a library log line quoting a storage URL never shows its password)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


__all__ = ["MASK", "RedactingFilter", "password_of", "redact", "with_password", "without_password"]
