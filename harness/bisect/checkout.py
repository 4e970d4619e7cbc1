"""The user's git checkout, read only: revisions, the commits between two, and a commit's tree exported with
`git archive` into a folder of ours, so the working tree, the branch and HEAD are never touched."""
from __future__ import annotations

import dataclasses
import subprocess
import tarfile
from pathlib import Path

from harness.errors import HarnessError

PACKAGE_DIRS = ("python", "")  # where a commit keeps its `sglang` package: python/sglang, else sglang/


@dataclasses.dataclass(frozen=True)
class Commit:
    hash: str
    date: str
    subject: str

    def __str__(self) -> str:
        return f"{self.hash[:10]} {self.date} {self.subject}"


class Checkout:
    def __init__(self, path: str):
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise HarnessError(f"{path} is not a folder; pass a git checkout of SGLang with --tree")
        done = self._git("rev-parse", "--git-dir", check=False)
        if done.returncode != 0:
            raise HarnessError(f"{path} is not a git checkout ({done.stderr.strip()}); pass a git clone of SGLang "
                               "with --tree")

    def _git(self, *args: str, check: bool = True, text: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=text)
        if check and done.returncode != 0:
            message = done.stderr.strip() if text else done.stderr.decode(errors="replace").strip()
            raise HarnessError(f"git {' '.join(args)} failed in {self.path}: {message}")
        return done

    def commit(self, revision: str) -> Commit:
        """The commit `revision` names; an unknown revision is a usage error that says so."""
        done = self._git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", check=False)
        if done.returncode != 0:
            raise HarnessError(f"revision {revision!r} does not exist in {self.path} (git rev-parse found no "
                               "commit by that name)")
        return self.describe(done.stdout.strip())

    def describe(self, full_hash: str) -> Commit:
        hash_, date, subject = self._git("log", "-1", "--format=%H%x00%ad%x00%s", "--date=short",
                                         full_hash).stdout.rstrip("\n").split("\0")
        return Commit(hash_, date, subject)

    def between(self, good: Commit, bad: Commit) -> list[Commit]:
        """The commits after `good` up to `bad` (included), oldest first, along bad's first-parent line."""
        if self._git("merge-base", "--is-ancestor", good.hash, bad.hash, check=False).returncode != 0:
            raise HarnessError(f"good {good} is not an ancestor of bad {bad}: give a good revision older than the "
                               "bad one")
        hashes = self._git("rev-list", "--reverse", "--first-parent", "--ancestry-path",
                           f"{good.hash}..{bad.hash}").stdout.split()
        if not hashes:
            raise HarnessError(f"no commit between good {good} and bad {bad}")
        return [self.describe(h) for h in hashes]

    def export(self, commit: Commit, into: Path) -> Path | None:
        """Write the commit's sglang package under `into` with `git archive`; the folder holding `sglang`, or
        None when the commit has no sglang package."""
        for folder in PACKAGE_DIRS:
            package = f"{folder}/sglang" if folder else "sglang"
            if self._git("cat-file", "-e", f"{commit.hash}:{package}/__init__.py", check=False).returncode == 0:
                archive = subprocess.Popen(["git", "-C", str(self.path), "archive", "--format=tar", commit.hash,
                                            package], stdout=subprocess.PIPE)
                with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
                    tar.extractall(into, filter="tar")  # "tar": links stay links (a tree may hold them)
                if archive.wait() != 0:
                    raise HarnessError(f"git archive {commit.hash} {package} failed in {self.path}")
                return into / folder if folder else into
        return None
