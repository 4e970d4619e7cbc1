"""Hypothesis's example database: where failures persist, so a rerun replays them first.

A directory (the default, under the report directory; point several CI workers at one shared path), or a
Redis URL so that machines share failures: one found anywhere replays everywhere.
"""
from __future__ import annotations

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from harness.errors import HarnessError


def open_database(location: str) -> ExampleDatabase:
    if not location.startswith(("redis://", "rediss://")):
        return DirectoryBasedExampleDatabase(location)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise HarnessError("--example-db is a Redis URL but the redis package is missing: "
                           "pip install -r requirements/harness.txt") from None
    client = redis.Redis.from_url(location, socket_connect_timeout=3, socket_timeout=5)
    try:
        client.ping()
    except redis.exceptions.RedisError as error:
        raise HarnessError(f"the example database at {location} does not answer ({error}); start it, fix the URL, "
                           "or use a directory (--example-db PATH)") from None
    return RedisExampleDatabase(client, key_prefix=b"sglang-harness:")
