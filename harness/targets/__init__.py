"""Targets: one adapter per SGLang code path, resolving module paths and names for the installed release,
so suites never hard-code a layout. A path the release lacks raises `PathMissing` (the suite skips with it)."""
