"""House rules that a reader cannot check by eye: no function in src/ over 80 lines (from its
``def`` line to its last line, as Python's own parser counts them), none over 8 parameters without
a reason in its docstring, no import of meshwise's own inside a function without a comment saying
why (nor of any module in the runtime's packages), and no import cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "meshwise"
MOST_LINES = 80
MOST_PARAMETERS = 8
# the reason a wider function gives: a sentence of its docstring that counts them ("Ten arguments: ...")
_REASON = re.compile(r"\b(nine|ten|eleven|twelve|thirteen|fourteen|fifteen|\d+)\s+(arguments|parameters)\b", re.I)


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


def wide_functions(root: Path, most: int = MOST_PARAMETERS) -> list[str]:
    """``path:line name (parameters)`` of every function under ``root`` taking more than ``most``
    parameters (``self`` and ``cls`` not counted; ``*args`` and ``**kwargs`` one each) whose
    docstring does not say why (:data:`_REASON`)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            count = len(names) - (names[:1] in (["self"], ["cls"])) + (a.vararg is not None) + (a.kwarg is not None)
            if count > most and not _REASON.search(ast.get_docstring(node) or ""):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({count})")
    return found


def test_no_function_in_src_takes_over_8_parameters_without_a_reason() -> None:
    assert wide_functions(SRC) == []


def test_the_check_sees_a_wide_function(tmp_path: Path) -> None:
    params = ", ".join(f"a{i}" for i in range(MOST_PARAMETERS))
    (tmp_path / "wide.py").write_text(
        f"class C:\n    def fits(self, {params}):\n        pass\n\n\n"
        f"def wide({params}, *rest):\n    pass\n\n\n"
        f'def said({params}, more):\n    """Nine arguments: the fields of its cache key."""\n'
    )
    assert wide_functions(tmp_path) == [f"{tmp_path.name}/wide.py:6 wide ({MOST_PARAMETERS + 1})"]


# the packages where an in-function import of any module (torch, the standard library, ...) says why,
# not only one of meshwise's own
EVERY_IMPORT = ("measure", "runtime", "train", "tune")


def lazy_imports(root: Path, every: tuple[str, ...] = EVERY_IMPORT) -> list[str]:
    """``path:line module`` of every import inside a function under ``root``, of meshwise's own modules
    (of any module under the packages ``every``), with no comment on its lines or the line above saying
    why it is lazy (torch in a planning path, an optional dependency, a measured start-up cost, a cycle)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    own = node.level > 0 or (node.module or "").startswith("meshwise")
                    name = node.module or "."
                elif isinstance(node, ast.Import):
                    own = any(a.name.startswith("meshwise") for a in node.names)
                    name = node.names[0].name
                else:
                    continue
                said = any("#" in line for line in lines[node.lineno - 1 : node.end_lineno])
                own = own or rel.parts[0] in every
                if own and not said and not lines[node.lineno - 2].strip().startswith("#"):
                    found.append(f"{root.name}/{rel}:{node.lineno} {name}")
    return found


def test_in_function_imports_say_why() -> None:
    assert lazy_imports(SRC) == []


def test_the_check_sees_an_unexplained_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "lazy.py").write_text(
        "import meshwise\n\n\ndef f():\n    from meshwise import layout\n\n\n"
        "def g():\n    from meshwise import spec  # start-up: g is rarely called\n\n\n"
        "def h():\n    import json\n"
    )
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "worker.py").write_text("def f():\n    import json\n")
    assert lazy_imports(tmp_path, every=("runtime",)) == [
        f"{tmp_path.name}/lazy.py:5 meshwise",
        f"{tmp_path.name}/runtime/worker.py:2 json",
    ]


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
