"""Errors the harness raises at a user: each says what is wrong and what to do."""


class HarnessError(Exception):
    """A usage or environment problem, reported as a message, not a traceback."""


class PathMissing(HarnessError):
    """The installed SGLang lacks a targeted code path: the suite skips with this reason, never passes."""


def writable(folder, what: str):
    """`folder` (a Path), created and written to once; a HarnessError naming `what` it is when it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-check"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise HarnessError(f"{what} {folder} cannot be written ({error.strerror})") from None
    return folder
