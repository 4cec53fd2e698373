"""The package's import graph (imports for annotations alone left out: they run nowhere):
no cycles, and the engines independent of each other; no module over 400 lines, no
function body over 80."""

import ast

import grimp
from helpers import ROOT


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("bulkembed", exclude_type_checking_imports=True)
    assert "bulkembed.engine.run" in graph.modules
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_no_engine_imports_another():
    graph = grimp.build_graph("bulkembed", exclude_type_checking_imports=True)
    for engine, other in [("local", "ray"), ("ray", "local")]:
        chain = graph.find_shortest_chain(f"bulkembed.engine.{engine}", f"bulkembed.engine.{other}")
        assert chain is None, chain


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its docstring excluded."""
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:] or body
    return (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines of each module of the package, and of each function body, by name."""
    modules, functions = {}, {}
    for path in sorted((ROOT / "bulkembed").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{name}:{node.lineno} {node.name}"] = _body_lines(node)
    return modules, functions


def test_modules_and_functions_stay_small():
    modules, functions = _sizes()
    assert modules["bulkembed/engine/run.py"] > 100  # the package was read
    assert {m: n for m, n in modules.items() if n > 400} == {}
    assert modules["bulkembed/engine/local.py"] <= 300
    assert {f: n for f, n in functions.items() if n > 80} == {}
