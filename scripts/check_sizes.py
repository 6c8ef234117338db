"""Fail when a module of ours is over 500 lines or a function over 80 (`make lint` runs it).

Small modules with one job, and functions that fit on a screen, are what keep this code
readable; generated code (ragplane/v1) is not ours to size. Usage:
`python scripts/check_sizes.py [--report] [DIR ...]` (default: every package of ours).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIRS = (
    "ragplane/core",
    "ragplane/index",
    "ragplane/server",
    "ragplane/testkit",
    "tests",
    "bench",
    "loadtest",
    "scripts",
)


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def measure(path: Path) -> tuple[int, list[tuple[str, int, int]]]:
    """(lines of the module, [(function, first line, lines)]) of one file.

    A function's lines run from its first decorator to its last line, nested functions
    included (they are read as part of it)."""
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    funcs = []
    for f in _functions(tree):
        start = min([f.lineno, *(d.lineno for d in f.decorator_list)])
        funcs.append((f.name, f.lineno, (f.end_lineno or f.lineno) - start + 1))
    return len(text.splitlines()), funcs


def main(argv: list[str]) -> int:
    report = "--report" in argv
    dirs = [a for a in argv if not a.startswith("--")] or list(DEFAULT_DIRS)
    problems, biggest_module, biggest_func = [], ("", 0), ("", 0)
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            rel = path.relative_to(ROOT)
            lines, funcs = measure(path)
            biggest_module = max(biggest_module, (str(rel), lines), key=lambda x: x[1])
            if lines > MAX_MODULE_LINES:
                problems.append(f"{rel}: {lines} lines (limit {MAX_MODULE_LINES}); split it")
            for name, lineno, n in funcs:
                biggest_func = max(biggest_func, (f"{rel}:{lineno} {name}", n), key=lambda x: x[1])
                if n > MAX_FUNCTION_LINES:
                    problems.append(
                        f"{rel}:{lineno}: {name} is {n} lines (limit {MAX_FUNCTION_LINES})"
                    )
    for p in problems:
        print(p, file=sys.stderr)
    if report or problems:
        print(f"largest module: {biggest_module[0]} ({biggest_module[1]} lines)")
        print(f"largest function: {biggest_func[0]} ({biggest_func[1]} lines)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
