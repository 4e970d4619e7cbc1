"""Targets: one package per SGLang code path (`compile_kwargs`, `decode`, `prefill`), each a registry of layout
modules, so suites never hard-code a release's layout. A path the release lacks raises `PathMissing`."""
from __future__ import annotations

from typing import Any
from collections.abc import Iterable

from harness.errors import PathMissing
from harness.versions import module_exists, require_sglang, sglang_version


def first_layout(layouts: Iterable[Any], absent: str) -> Any:
    """The layout of the first module in `layouts` whose `detect()` recognises the installed SGLang (newest
    first); PathMissing(f"SGLang VERSION: {absent}") when none does."""
    require_sglang()
    for module in layouts:
        layout = module.detect()
        if layout is not None:
            return layout
    raise PathMissing(f"SGLang {sglang_version()}: {absent}")


def require_modules(names: Iterable[str], what: str) -> None:
    """PathMissing naming the release and each module of `names` it lacks, for a layout it has only in part."""
    missing = [name for name in names if not module_exists(name)]
    if missing:
        raise PathMissing(f"SGLang {sglang_version()} has {what} but misses module(s) {', '.join(missing)}")
