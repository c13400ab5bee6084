"""The package's layout: imports flow one way, from the CLI down to the math (no circle, no
import from a lower floor to a higher one), and no function is longer than a screenful or two.
``docs/architecture.md`` explains the floors."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "tokenergy"

# Bottom to top; a module may import its own floor and the floors below it.
FLOORS = [
    ["types", "ops", "registry"],
    ["distributed", "safety", "advantages", "losses", "energy"],
    ["envs"],
    ["models"],
    ["config"],
    ["runs"],
    ["rollout"],
    ["credit", "search"],
    ["algos", "integrations"],
    ["reports"],
    ["experiments"],
    ["cli"],
]
MAX_FUNCTION_LINES = 120


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of this package that ``name`` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def floor_of(name: str) -> int:
    top = name.split(".")[1] if "." in name else ""
    for i, floor in enumerate(FLOORS):
        if top in floor:
            return i
    raise AssertionError(f"{name}: not on any floor of tests/test_layout.py")


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert cycles(graph()) == []


def test_no_import_from_a_lower_floor_to_a_higher_one():
    upward = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a != "tokenergy"
        for b in sorted(targets)
        if floor_of(b) > floor_of(a)
    ]
    assert upward == []


def test_the_checks_find_a_circle_and_an_upward_import():
    g = {"tokenergy.a": {"tokenergy.b"}, "tokenergy.b": {"tokenergy.a"}, "tokenergy.c": set()}
    assert cycles(g) == [["tokenergy.a", "tokenergy.b"]]
    assert (
        floor_of("tokenergy.cli")
        > floor_of("tokenergy.rollout.generate")
        > floor_of("tokenergy.types")
    )


def test_no_function_over_120_lines():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {n} lines")
    assert long == []


def test_the_lm_iteration_loop_reads_in_one_screen():
    tree = ast.parse((SRC / "algos" / "lm.py").read_text())
    train = next(n for n in ast.walk(tree) if getattr(n, "name", "") == "train_lm")
    loop = next(n for n in ast.walk(train) if isinstance(n, ast.For))
    assert loop.end_lineno - loop.lineno + 1 < 60
    stages = [c.func.id for c in ast.walk(loop) if isinstance(c, ast.Call)
              and isinstance(c.func, ast.Name)]  # fmt: skip
    order = ["collect", "score_batch", "assign_credit", "update", "evaluate_and_save"]
    assert [s for s in stages if s in order] == order
