"""The security headers of the service's answers, in one place for the middleware that adds them
and for the one answer produced outside it (a 500, which Starlette renders outside all middleware)."""

from __future__ import annotations

# Every answer: a browser takes it as the type it says (never guesses a script out of JSON or
# text), and shows no page of this server in a frame (for browsers that predate frame-ancestors).
SECURITY_HEADERS: dict[str, str] = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}

# An HTML page without a policy of its own may load only this server's files (images also from data:
# and blob: URLs, which the playground makes in the browser), and no page may be framed (clickjacking).
HTML_POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)
