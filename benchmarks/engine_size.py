"""The comparison engine's size: lines of each file of ``validator/numerics/backends``, and of code alone.

    python benchmarks/engine_size.py

"code" leaves out blank lines, comment lines and docstrings (the way line counters such as cloc count
Python by default); "lines" is every line of the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "validator" / "numerics" / "backends"


def docstring_lines(tree: ast.Module) -> set[int]:
    """Line numbers of the module's, classes' and functions' docstrings."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return found


def main() -> None:
    total_lines = total_code = 0
    for path in sorted(ENGINE.glob("*.py")):
        text = path.read_text()
        skip = docstring_lines(ast.parse(text))
        lines = text.splitlines()
        code = sum(1 for i, line in enumerate(lines, 1) if line.strip() and not line.strip().startswith("#") and i not in skip)
        total_lines, total_code = total_lines + len(lines), total_code + code
        print(f"{path.name:14s} {len(lines):6d} lines {code:6d} code")
    print(f"{'engine':14s} {total_lines:6d} lines {total_code:6d} code")


if __name__ == "__main__":
    main()
