"""How much of SGLang's targeted code a run really executed (coverage.py restricted to those files, or to
named functions in them), so people can see what the harness drives and what it leaves unreached.

Targets are `path/in/sglang[::function]`, per suite in `harness.registry`; a function target counts only the
statements inside it.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
from pathlib import Path

from harness.checkout import REPO_ROOT
from harness.devices.triton_interpreter import keep_traced
from harness.registry import coverage_rows

LINE_TESTS = "line_tests.json"  # beside the data file: file -> line -> the test items that executed it
LINE_TESTS_FORMAT = 1


def row_labels(targets) -> dict[str, str]:
    """Each target's label in a suite's coverage row: its file name (with its `::function`), or as many of its
    folders as tell it apart from another target of the same name (`attention/triton_backend.py`,
    `backend/triton_backend.py`)."""
    paths = {target: target.partition("::")[0].split("/") for target in targets}
    labels = {}
    for target, parts in paths.items():
        depth = 1
        while depth < len(parts) and any(other != target and other_parts[-depth:] == parts[-depth:]
                                         and other.partition("::")[0] != target.partition("::")[0]
                                         for other, other_parts in paths.items()):
            depth += 1
        function = target.partition("::")[2]
        labels[target] = "/".join(parts[-depth:]) + (f"::{function}" if function else "")
    return labels


def _function_lines(path: Path, name: str) -> set[int] | None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return set(range(node.lineno, node.end_lineno + 1))
    return None


def harness_commit() -> str | None:
    """The harness checkout's commit (None outside git): a line map from another commit may map other tests."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def package_version(sglang_dir: Path) -> str:
    """The release of the `sglang` package at `sglang_dir` (from the dist-info beside it; "source tree" if none)."""
    found = sorted(Path(sglang_dir).parent.glob("sglang-*.dist-info"))
    return found[0].name.removeprefix("sglang-").removesuffix(".dist-info") if found else "source tree"


def targets_digest(sglang_dir: Path) -> str:
    """A digest of the targeted files' text: a line map of other text maps other lines."""
    digest = hashlib.sha256()
    for relative in sorted({t.split("::")[0] for _, _, targets in coverage_rows().values() for t in targets}):
        path = Path(sglang_dir) / relative
        digest.update(relative.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return digest.hexdigest()[:16]


class SGLangCoverage:
    """Measure in every process that drives SGLang (each xdist worker too), each writing its own data file under
    the report directory; the controlling process combines them into one record per suite."""

    def __init__(self, sglang_dir: str, report_dir: Path):
        import coverage

        self.root = Path(sglang_dir)
        self.data_file = Path(report_dir) / ".sglang-coverage"
        files = {t.split("::")[0] for _, _, targets in coverage_rows().values() for t in targets}
        self.include = [str(self.root / f) for f in files]
        keep_traced(self.include)
        self.cov = coverage.Coverage(data_file=str(self.data_file), data_suffix=True, include=self.include,
                                     config_file=False, branch=True)

        self.durations: dict[str, float] = {}  # nodeid -> seconds (setup + call + teardown), in the controller

    def start(self) -> None:
        self.cov.start()

    def switch(self, nodeid: str) -> None:
        """Attribute what runs from now on to test item `nodeid` ('': outside any item, e.g. collection)."""
        self.cov.switch_context(nodeid)

    def stop(self) -> None:
        self.cov.stop()
        self.cov.save()

    def child(self, nodeid: str) -> dict:
        """What a process this one starts needs to measure the same way (a world's rank: `measuring`), its data
        attributed to test item `nodeid`; the data file joins this run's, combined by `results()`."""
        return {"data_file": str(self.data_file), "include": list(self.include), "context": nodeid}

    def results(self) -> list[dict]:
        """Combine every process's data (and remove it) into one record per suite."""
        import coverage

        combined = coverage.Coverage(data_file=str(self.data_file), include=self.include, config_file=False,
                                     branch=True)
        combined.combine(data_paths=[str(self.data_file.parent)], keep=False)
        records = []
        for suite, (_, _, targets) in coverage_rows().items():
            per_file, statements_total, covered_total = {}, 0, 0
            branch_files, branches_total, taken_total = {}, 0, 0
            labels = row_labels(targets)
            for target in targets:
                relative, _, function = target.partition("::")
                path = self.root / relative
                if not path.exists():
                    continue
                # coverage.py's own analysis: it maps each executed line of a multi-line statement to the
                # statement's first line, which the raw executed lines do not
                _, statements, _, missing, _ = combined.analysis2(os.fspath(path))
                # branch mode: each line with more than one way out, and how many of its ways the run took
                branch_lines = combined._analyze(os.fspath(path)).branch_stats()
                if function:
                    lines = _function_lines(path, function)
                    if lines is None:
                        continue
                    statements = [s for s in statements if s in lines]
                    branch_lines = {line: v for line, v in branch_lines.items() if line in lines}
                covered = len(set(statements) - set(missing))
                statements_total += len(statements)
                covered_total += covered
                per_file[labels[target]] = 100.0 * covered / max(1, len(statements))
                branches = sum(total for total, _ in branch_lines.values())
                taken = sum(took for _, took in branch_lines.values())
                branches_total += branches
                taken_total += taken
                branch_files[labels[target]] = 100.0 * taken / max(1, branches)
            if covered_total:
                records.append({"suite": suite, "statements": statements_total, "covered": covered_total,
                                "percent": 100.0 * covered_total / max(1, statements_total), "files": per_file,
                                "branches": branches_total, "branches_taken": taken_total,
                                "branch_percent": 100.0 * taken_total / max(1, branches_total),
                                "branch_files": branch_files})
        return records

    def write_line_tests(self, run_id: str) -> Path:
        """After `results()`: LINE_TESTS beside the combined data, so `mutate` can run only the items that execute
        a mutated line, fastest first. A line executed outside every item (at import) maps to []."""
        import coverage

        data = coverage.CoverageData(basename=str(self.data_file))
        data.read()
        root = self.root.resolve()
        files = {}
        for measured in sorted(data.measured_files()):
            try:
                relative = Path(measured).resolve().relative_to(root).as_posix()
            except ValueError:
                continue
            by_line = data.contexts_by_lineno(measured)
            files[relative] = {str(line): sorted(c for c in contexts if c)
                               for line, contexts in sorted(by_line.items())}
        path = self.data_file.parent / LINE_TESTS
        path.write_text(json.dumps({
            "format": LINE_TESTS_FORMAT, "run_id": run_id, "sglang": package_version(self.root),
            "sglang_path": str(self.root), "targets_digest": targets_digest(self.root),
            "harness_commit": harness_commit(), "durations": {k: round(v, 3) for k, v in self.durations.items()},
            "files": files}))
        return path


def measuring(settings: dict | None):
    """Measure the block as `SGLangCoverage.child` said (a context manager; nothing when `settings` is None)."""
    import contextlib

    if settings is None:
        return contextlib.nullcontext()
    import coverage

    cov = coverage.Coverage(data_file=settings["data_file"], data_suffix=True, include=settings["include"],
                            config_file=False, branch=True)
    keep_traced(settings["include"])

    @contextlib.contextmanager
    def block():
        cov.start()
        cov.switch_context(settings["context"])
        try:
            yield
        finally:
            cov.stop()
            cov.save()

    return block()
