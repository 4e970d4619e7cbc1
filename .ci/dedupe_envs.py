"""Hard-link identical files across the environments CI keeps, so the releases that pin the same torch (0.5.9 and
0.5.10 share torch 2.9.1 and its CUDA libraries) hold one copy on disk, not one each. CI's disk is shared and was
once found with 4 GB free: a failed build there is a red CI for a reason that has nothing to do with the code.

Safe because pip never writes into an installed file (it writes new files and unlinks old ones), and `harness.sh`
removes an environment whole before it rebuilds it: unlinking one name leaves the other environments' copies.

    python3 .ci/dedupe_envs.py FOLDER [FOLDER ...]
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections import defaultdict
from pathlib import Path

SMALLEST = 1 << 20  # files under 1 MiB are not worth hashing: the libraries that matter are tens to hundreds of MiB


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            sha.update(block)
    return sha.hexdigest()


def dedupe(roots: list[Path]) -> tuple[int, int]:
    """Link every duplicate (same size, same bytes) to one copy; returns (files linked, bytes freed)."""
    by_size: dict[int, list[Path]] = defaultdict(list)
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.stat().st_size >= SMALLEST:
                by_size[path.stat().st_size].append(path)
    linked = freed = 0
    for size, paths in by_size.items():
        if len({path.stat().st_ino for path in paths}) < 2:
            continue  # one file, or already linked by an earlier run: nothing to hash
        first_of: dict[str, Path] = {}
        for path in paths:
            kept = first_of.setdefault(_digest(path), path)
            if kept is path or os.path.samefile(kept, path):
                continue
            spare = path.with_name(path.name + ".dedupe")
            os.link(kept, spare)
            os.replace(spare, path)
            linked, freed = linked + 1, freed + size
    return linked, freed


if __name__ == "__main__":
    folders = [Path(arg) for arg in sys.argv[1:] if Path(arg).is_dir()]
    count, saved = dedupe(folders)
    print(f"[ci] {count} duplicate files hard-linked across {len(folders)} environments, {saved / 2**30:.1f} GiB freed")
