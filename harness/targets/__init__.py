"""Targets: one adapter per SGLang code path, resolving module paths and names for the installed release,
so suites never hard-code a layout. A path the release lacks raises `PathMissing` (the suite skips with it)."""


def module_exists(name: str) -> bool:
    """Whether the installed SGLang has module `name`; False also when a parent package fails to import."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
