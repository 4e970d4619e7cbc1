"""Tiny models the harness builds itself (no weights to download), small enough that expectations are derivable."""
