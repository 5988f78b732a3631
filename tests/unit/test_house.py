"""House rules that a reader cannot check by eye: no function in src/ over 80 lines (from its
``def`` line to its last line, as Python's own parser counts them)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "meshwise"
MOST_LINES = 80


def long_functions(root: Path, most: int = MOST_LINES) -> list[str]:
    """``path:line name (lines)`` of every function or method under ``root`` longer than ``most``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines})")
    return found


def test_no_function_in_src_is_over_80_lines() -> None:
    assert SRC.is_dir()
    assert long_functions(SRC) == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MOST_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}")
    assert long_functions(tmp_path) == [f"{tmp_path.name}/long.py:6 long ({MOST_LINES + 1})"]


def test_no_import_cycle() -> None:
    """No module of meshwise imports, directly or through others, a module that imports it back
    (imports inside functions included: grimp reads them all)."""
    import grimp

    graph = grimp.build_graph("meshwise")
    cycles = sorted(
        {
            tuple(sorted((a, b)))
            for a in graph.modules
            for b in graph.find_modules_directly_imported_by(a)
            if graph.chain_exists(importer=b, imported=a)
        }
    )
    assert cycles == []
