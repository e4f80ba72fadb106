"""The code's shape, held: no module over 400 lines, no function over 60, no import loop,
one clock, and ``Any`` only at the wire's edge: ``kube/rest.py``'s ``Json``, the decoded
body of an API response, before the contract models and the slim projections give it a
shape."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp

SRC = Path(__file__).resolve().parents[2] / "src"
MOST_LINES = 400
MOST_FUNCTION_LINES = 60
WIRE_EDGE = "gpuguard/kube/rest.py"  # the one module that may spell Any
MOST_ANY = 2  # its import and ``Json = dict[str, Any]``


def sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.py"))}


def test_no_module_is_longer_than_400_lines():
    lines = {name: text.count("\n") for name, text in sources().items()}
    assert {name: n for name, n in lines.items() if n > MOST_LINES} == {}


def test_no_function_is_longer_than_60_lines():
    lengths: dict[str, int] = {}
    for name, text in sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                lengths[f"{name}:{node.lineno}:{node.name}"] = size
    assert {key: n for key, n in lengths.items() if n > MOST_FUNCTION_LINES} == {}


def loops(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == module:
                        break
                if len(group) > 1:
                    found.append(group)
    return found


def test_no_import_loop():
    assert loops(grimp.build_graph("gpuguard")) == []


def test_any_is_spelled_only_at_the_wire_edge():
    uses = {name: n for name, text in sources().items() if (n := len(re.findall(r"\bAny\b", text)))}
    print(f"uses of Any in src/: {sum(uses.values())} ({uses})")
    assert uses.keys() <= {WIRE_EDGE}, f"Any outside {WIRE_EDGE}: {uses}"
    assert sum(uses.values()) <= MOST_ANY


def test_every_time_read_goes_through_the_clock():
    """``clock.Clock`` is the one clock (a fake one in tests): no other module reads the
    machine's time itself."""
    readers = set()
    for name, text in sources().items():
        for node in ast.walk(ast.parse(text)):
            called = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(called, ast.Attribute)
                and isinstance(called.value, ast.Name)
                and called.value.id == "time"
                and called.attr in ("time", "monotonic", "perf_counter", "time_ns")
            ):
                readers.add(name)
    assert readers <= {"gpuguard/clock.py"}
