"""How much of SGLang's targeted code a run really executed (coverage.py restricted to those files, or to
named functions in them), so people can see what the harness drives and what it leaves unreached.

Targets are `path/in/sglang[::function]`, per suite in `harness.registry`; a function target counts only the
statements inside it.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

from harness.registry import coverage_rows


def _function_lines(path: Path, name: str) -> set[int] | None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return set(range(node.lineno, node.end_lineno + 1))
    return None


class SGLangCoverage:
    """Measure in every process that drives SGLang (each xdist worker too), each writing its own data file under
    the report directory; the controlling process combines them into one record per suite."""

    def __init__(self, sglang_dir: str, report_dir: Path):
        import coverage

        self.root = Path(sglang_dir)
        self.data_file = Path(report_dir) / ".sglang-coverage"
        files = {t.split("::")[0] for _, _, targets in coverage_rows().values() for t in targets}
        self.include = [str(self.root / f) for f in files]
        self.cov = coverage.Coverage(data_file=str(self.data_file), data_suffix=True, include=self.include,
                                     config_file=False)

    def start(self) -> None:
        self.cov.start()

    def stop(self) -> None:
        self.cov.stop()
        self.cov.save()

    def results(self) -> list[dict]:
        """Combine every process's data (and remove it) into one record per suite."""
        import coverage

        combined = coverage.Coverage(data_file=str(self.data_file), include=self.include, config_file=False)
        combined.combine(data_paths=[str(self.data_file.parent)], keep=False)
        records = []
        for suite, (_, _, targets) in coverage_rows().items():
            per_file, statements_total, covered_total = {}, 0, 0
            for target in targets:
                relative, _, function = target.partition("::")
                path = self.root / relative
                if not path.exists():
                    continue
                # coverage.py's own analysis: it maps each executed line of a multi-line statement to the
                # statement's first line, which the raw executed lines do not
                _, statements, _, missing, _ = combined.analysis2(os.fspath(path))
                if function:
                    lines = _function_lines(path, function)
                    if lines is None:
                        continue
                    statements = [s for s in statements if s in lines]
                covered = len(set(statements) - set(missing))
                statements_total += len(statements)
                covered_total += covered
                per_file[target.rsplit("/", 1)[-1]] = 100.0 * covered / max(1, len(statements))
            if covered_total:
                records.append({"suite": suite, "statements": statements_total, "covered": covered_total,
                                "percent": 100.0 * covered_total / max(1, statements_total), "files": per_file})
        return records
