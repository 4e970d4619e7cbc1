"""Errors the harness raises at a user: each says what is wrong and what to do."""


class HarnessError(Exception):
    """A usage or environment problem, reported as a message, not a traceback."""


class PathMissing(HarnessError):
    """The installed SGLang lacks a targeted code path: the suite skips with this reason, never passes."""
