"""First-order mutants of one source file, derived from its AST: each is one small change a careless edit could
make (a flipped comparison, a negated condition, `and`/`or` swapped, an integer off by one, `True`/`False`
swapped, a statement removed, a returned value dropped, two adjacent call arguments swapped, `min`/`max`
swapped), written back into the file's own text so everything else stays byte for byte the same.

Never mutated: docstrings and other string constants, logging calls (`logger.*`, `logging.*`, `warnings.warn`,
`print`: changing what is logged is not a bug a graph oracle should see), an `if` that only logs (its test and its
branches) and annotations.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
from collections.abc import Iterator

COMPARISON_FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
LOGGING_ROOTS = ("logger", "logging", "log", "_logger")
LOGGING_CALLS = ("warnings.warn", "print")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One change to `file` (its path inside the sglang package) in `function`: the text from `start` to `end`
    ((line, byte column) pairs, as the AST gives them) becomes `replacement`. `line` is the enclosing statement's
    first line; `original` and `mutated` the changed lines before and after, each joined
    into one; `base` the digest of the file's text, so a mutant of another release's text gets another id."""
    file: str
    function: str
    line: int
    operator: str
    start: tuple[int, int]
    end: tuple[int, int]
    replacement: str
    original: str
    mutated: str
    base: str

    @property
    def lines(self) -> tuple[int, ...]:
        """The lines whose execution shows the change ran: its statement's first line and every line the changed
        text spans. Coverage on Python 3.11 records a parenthesised multi-line condition on its operands' lines,
        not the `if (` line (a seed-6029 mutant of `can_replay_locally` was reported unreached though it ran)."""
        return tuple(sorted({self.line, *range(self.start[0], self.end[0] + 1)}))

    @property
    def id(self) -> str:
        """Stable across runs and machines: the same change to the same text gets the same id."""
        key = repr((self.file, self.function, self.operator, self.start, self.end, self.replacement, self.base))
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    def apply(self, text: str) -> str:
        """The file's text with this change made."""
        lines = text.encode().splitlines(keepends=True)
        (first, column), (last, end_column) = self.start, self.end
        changed = lines[first - 1][:column] + self.replacement.encode() + lines[last - 1][end_column:]
        return b"".join(lines[:first - 1] + [changed] + lines[last:]).decode()


# calls whose positional arguments commute: swapping two of them is an equivalent mutant, never a test of anything
# (a seed-13 draw spent a run on `min(table_width, configured_context)` swapped)
COMMUTATIVE_CALLS = frozenset({"min", "max", "math.gcd", "operator.add", "operator.mul", "torch.maximum",
                               "torch.minimum"})

def dotted(node: ast.AST) -> str:
    """`a.b.c` for a Name/Attribute chain ('' for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def is_logging(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = dotted(node.func)
    return name in LOGGING_CALLS or name.split(".")[0] in LOGGING_ROOTS


def only_logs(statement: ast.stmt) -> bool:
    """A logging call, or an `if` whose test calls nothing and whose branches only log: removing it, or negating or
    flipping its test, changes what is logged and nothing else (a seed-7717 draw spent a run on the prefill
    runner's `if dp_flags.prefill_graph_has_dp_gather: logger.info(...)`)."""
    if isinstance(statement, ast.Expr):
        return is_logging(statement.value)
    if not isinstance(statement, ast.If):
        return False
    if any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await)) for n in ast.walk(statement.test)):
        return False
    return all(only_logs(s) for s in (*statement.body, *statement.orelse))


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _changes(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(operator, replacement node) for each mutant of `node` itself (its children are visited apart)."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARISON_FLIPS:
        yield "flip-comparison", ast.Compare(node.left, [COMPARISON_FLIPS[type(node.ops[0])]()], node.comparators)
    if isinstance(node, ast.BoolOp):
        yield "swap-and-or", ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        yield "swap-true-false", ast.Constant(not node.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield "constant-plus-one", ast.Constant(node.value + 1)
        yield "constant-minus-one", ast.Constant(node.value - 1)
    if isinstance(node, ast.Call):
        name = dotted(node.func)
        if name in ("min", "max"):
            yield "swap-min-max", ast.Call(ast.Name("max" if name == "min" else "min", ast.Load()), node.args,
                                           node.keywords)
        for i in range(len(node.args) - 1 if name not in COMMUTATIVE_CALLS else 0):  # a swap there changes nothing
            a, b = node.args[i], node.args[i + 1]
            if not isinstance(a, ast.Starred) and not isinstance(b, ast.Starred) and ast.dump(a) != ast.dump(b):
                args = list(node.args)
                args[i], args[i + 1] = b, a
                yield "swap-call-args", ast.Call(node.func, args, node.keywords)


def _condition_of(node: ast.AST) -> ast.expr | None:
    return node.test if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)) else None


def _negated(test: ast.expr) -> ast.expr:
    return test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else \
        ast.UnaryOp(ast.Not(), test)


def _joined(lines: list[bytes]) -> str:
    return " ".join(line.decode().strip() for line in lines)


def _skipped_children(node: ast.AST) -> set[int]:
    """Children never mutated: annotations, f-string parts (their text is not ordinary code)."""
    skip = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        skip += [node.returns, *node.decorator_list]
        skip += [a.annotation for a in (*node.args.args, *node.args.posonlyargs, *node.args.kwonlyargs,
                                        node.args.vararg, node.args.kwarg) if a is not None]
    if isinstance(node, ast.AnnAssign):
        skip.append(node.annotation)
    return {id(n) for n in skip if n is not None}


def function_mutants(relative: str, text: str, function: str, node: ast.AST) -> Iterator[Mutant]:
    """Every mutant inside the body of function `node` (named `function`) of file `relative` with text `text`."""
    lines = text.encode().splitlines(keepends=True)
    base = hashlib.sha256(text.encode()).hexdigest()[:16]
    statement_line = node.lineno

    def make(operator: str, target: ast.AST, replacement: str, line: int) -> Mutant:
        if isinstance(target, ast.expr):
            replacement = f"({replacement})"  # keeps precedence: `a and b or c` -> `(a or b) or c`
        first, last = target.lineno, target.end_lineno
        before = lines[first - 1:last]
        after = [lines[first - 1][:target.col_offset] + replacement.encode() + lines[last - 1][target.end_col_offset:]]
        return Mutant(relative, function, line, operator, (target.lineno, target.col_offset),
                      (target.end_lineno, target.end_col_offset), replacement, _joined(before), _joined(after), base)

    def visit(current: ast.AST, line: int) -> Iterator[Mutant]:
        if isinstance(current, ast.JoinedStr) or is_logging(current) or (
                isinstance(current, ast.If) and only_logs(current)):
            return
        if isinstance(current, ast.stmt):
            line = current.lineno
        for operator, replacement in _changes(current):
            yield make(operator, current, ast.unparse(replacement), line)
        test = _condition_of(current)
        if test is not None:
            yield make("negate-condition", test, ast.unparse(_negated(test)), line)
        # `return False` (or 0, "") as `return None`: as falsy, so equivalent wherever the caller tests the result
        # (the seed-21 draw spent a run on `_can_run_ragged_verify_graph`'s); None itself is no mutation
        if isinstance(current, ast.Return) and current.value is not None and not (
                isinstance(current.value, ast.Constant) and not current.value.value):
            yield make("drop-return-value", current, "return None", line)
        blocks = [getattr(current, f, None) for f in ("body", "orelse", "finalbody")]
        body_statements = [s for block in blocks if isinstance(block, list) for s in block]
        for statement in body_statements:
            if _removable(statement):
                yield make("remove-statement", statement, "pass", statement.lineno)
        skipped = _skipped_children(current)
        for child in ast.iter_child_nodes(current):
            if id(child) not in skipped:
                yield from visit(child, line)

    yield from visit(node, statement_line)


def _removable(statement: ast.stmt) -> bool:
    """A statement whose removal is a plausible bug: not a definition, docstring, `pass`, a return (dropping its
    value is its own operator) or a statement that only logs."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass, ast.Return,
                              ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)):
        return False
    if _is_docstring(statement):
        return False
    return not only_logs(statement)


def valid(mutant: Mutant, text: str, original_dump: str) -> bool:
    """The mutated file parses and differs from the original (`ast.dump` of `text`) as code, not only in text."""
    try:
        return ast.dump(ast.parse(mutant.apply(text))) != original_dump
    except SyntaxError:
        return False


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of each top-level function and each method of a top-level class."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item
