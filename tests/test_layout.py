"""The package's shape: folders read as the pipeline, lower stages never import higher ones, no cycles.

The module graph is read with `ast` from every file of caseledger/, imports inside functions included
(imports under `if TYPE_CHECKING:` are types only and never run). `from pkg import name` is an arrow to
`pkg.name` when that is a module, else to `pkg`.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "caseledger"

# Lowest first. A module may import from its own stage or a lower one, never from a higher one.
STAGES: list[tuple[str, ...]] = [
    # base: errors, fault points, processes, raw records, secrets, the workspace (its files, slow steps named),
    # the engine profiles (data: what caseledger knows about each serving engine)
    ("errors", "faults", "procs", "records", "redact", "workspace", "engines"),
    ("case",),  # what to measure, the impact table, delta -> plan, frozen storage
    ("ledger",),  # events, leases, runs, folded state, queue, authorization
    ("datasets",),  # materialized requests and their identity
    ("metrics",),  # raw -> results per window
    ("load", "target"),  # the load client; the embedded reference target
    ("services",),  # bring a target to the case's identity (local or over SSH)
    ("outcome",),  # a run's figures, decision, report and time ledger
    ("campaign",),  # a campaign's declaration, planner, strategies and answer (its points' runs: outcome)
    ("views",),  # a scenario's cases and campaigns, HANDOFF.md, their charts and pages
    ("run",),  # create/start, controller, phase bodies, preflight, resume, a campaign's driver (starts its runs)
    ("tools",),  # the six tools
    ("importers", "server", "demo", "init"),  # AISBench import, MCP wiring, the demo, a new workspace
    ("cli", "__main__", "__init__"),  # entry points
]
RANK = {name: n for n, names in enumerate(STAGES) for name in names}

# Imports that may stay inside functions: heavy third-party modules (import cost, or only some commands
# need them), and caseledger modules that pull one of them in at import time.
HEAVY = {
    "mcp",
    "numpy",
    "transformers",
    "tokenizers",
    "matplotlib",
    "asyncssh",
    "uvicorn",
    "starlette",
    "httpx2",
    "gguf",
    "optuna",
}

# caseledger modules slow to import on their own, as heavy as the modules above for this rule: the case models
# (case.model and its sections; ~0.1-0.2 s of pydantic model building, and everything that reads a case imports
# them), which `caseledger mcp` starts without (tests/test_mcp_start.py).
SLOW = {f"caseledger.case.{m}" for m in ("model", "target", "service", "dataset", "measurement", "decision")}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (caseledger.* or a third-party top-level name)
    line: int
    in_function: bool
    reason: str | None  # the '# lazy: ...' comment on the line or the line above


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _lazy_names() -> dict[str, dict[str, str]]:
    """Per package whose `__init__` resolves names lazily (PEP 562, a `_LAZY = {name: module}` literal): where
    each name lives. `from pkg import name` then imports that module, not the whole package."""
    out: dict[str, dict[str, str]] = {}
    for mod, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            if isinstance(target, ast.Name) and target.id == "_LAZY" and isinstance(node.value, ast.Dict):
                out[mod] = {
                    ast.literal_eval(k): ast.literal_eval(v)
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                }
    return out


LAZY = _lazy_names()


def _import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Each import statement not under `if TYPE_CHECKING:`, in the order of the source, and whether it is inside a
    function: one pass over the tree."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    while stack:
        node, typed, fn = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if not typed:
                found.append((node, fn))
            continue
        fn = fn or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):  # its else: runs
            stack.extend((child, True, fn) for child in node.body)
            stack.extend((child, typed, fn) for child in node.orelse)
            continue
        stack.extend((child, typed, fn) for child in ast.iter_child_nodes(node))
    return sorted(found, key=lambda f: (f[0].lineno, f[0].col_offset))


def _imports() -> Iterator[Import]:
    for mod, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        is_pkg = path.name == "__init__.py"
        for node, in_function in _import_nodes(ast.parse(text)):
            near = " ".join(lines[max(0, node.lineno - 2) : node.end_lineno or node.lineno])
            m = re.search(r"# lazy: (\S.*)", near)
            reason = m.group(1) if m else None
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg) + (f".{node.module}" if node.module else "")
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else LAZY.get(base, {}).get(a.name, base)
                    for a in node.names
                ]
            for t in dict.fromkeys(targets):
                if t.split(".")[0] == "caseledger":
                    while t not in MODULES and "." in t:
                        t = t.rsplit(".", 1)[0]
                else:
                    t = t.split(".")[0]
                if t != mod:
                    yield Import(mod, t, node.lineno, in_function, reason)


def test_the_import_reader_tells_type_only_and_in_function_imports_apart() -> None:
    """What every rule below reads: an import under `if TYPE_CHECKING:` is not one (its `else:` runs); one in a
    function (nested or async, or in a class's method) is in a function; the rest are at the top, in source order."""
    src = """
import a
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import b
    def typed() -> None:
        import c
else:
    import d
def f() -> None:
    import e
    async def g() -> None:
        from h import i
class K:
    def m(self) -> None:
        import j
    import k
"""
    got = [(n.names[0].name if isinstance(n, ast.Import) else n.module, fn) for n, fn in _import_nodes(ast.parse(src))]
    assert got == [("a", False), ("typing", False), ("d", False), ("e", True), ("h", True), ("j", True), ("k", False)]


@functools.cache
def imports() -> list[Import]:
    """Every import of the package (read on first use: walking every module's tree takes ~2 s, which each pytest
    worker would otherwise pay when it collects this module)."""
    return list(_imports())


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in imports():
        if i.target in MODULES:
            edges[i.source].add(i.target)
    return edges


def _stage(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _heavy_modules(edges: dict[str, set[str]]) -> set[str]:
    """caseledger modules that import a heavy module at import time, directly or through another module."""
    direct = {i.source for i in imports() if not i.in_function and i.target in HEAVY} | SLOW
    top = {
        m: {i.target for i in imports() if i.source == m and not i.in_function and i.target in MODULES} for m in MODULES
    }
    heavy = set(direct)
    changed = True
    while changed:
        changed = False
        for m, ts in top.items():
            if m not in heavy and ts & heavy:
                heavy.add(m)
                changed = True
    return heavy


def test_every_package_has_a_stage() -> None:
    assert {_stage(m) for m in MODULES} <= set(RANK), "add the new folder to STAGES in pipeline order"


def test_no_import_cycles() -> None:
    assert _cycles(_edges()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lower_stages_never_import_higher_ones() -> None:
    bad = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in imports()
        if i.target in MODULES and RANK[_stage(i.target)] > RANK[_stage(i.source)]
    ]
    assert bad == []


def test_at_most_eight_modules_at_the_top() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= 8, top


# "plan" means one thing: the phases a run's delta derives (case/plan.py). The campaign's chooser is the planner,
# the load client's request times are its schedule. These names use the word in that one meaning.
PLAN_NAMES = {"caseledger.case.plan", "caseledger.ledger.runs.plan_step", "caseledger.run.start.plan_now"}
_PLAN = re.compile(r"plan(?!ned|ner)", re.IGNORECASE)


def _plan_names(modules: dict[str, Path]) -> list[str]:
    """Modules, classes and functions whose name says "plan" (not "planned", "planner") outside PLAN_NAMES."""
    out = []
    for mod, path in modules.items():
        if _PLAN.search(mod.rsplit(".", 1)[-1]) and mod not in PLAN_NAMES:
            out.append(mod)
        if mod in PLAN_NAMES:
            continue
        defs = (
            n
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        )
        out += [f"{mod}.{n.name}" for n in defs if _PLAN.search(n.name) and f"{mod}.{n.name}" not in PLAN_NAMES]
    return out


def test_plan_has_one_meaning() -> None:
    assert _plan_names(MODULES) == []


def test_the_plan_name_finder_names_a_second_meaning(tmp_path: Path) -> None:
    (tmp_path / "plan.py").write_text("class LoadPlan:\n    def planned(self) -> int: ...\ndef plan_of(): ...\n")
    (tmp_path / "planner.py").write_text("def standing(): ...\n")
    mods = {"x.load.plan": tmp_path / "plan.py", "x.campaign.planner": tmp_path / "planner.py"}
    assert _plan_names(mods) == ["x.load.plan", "x.load.plan.LoadPlan", "x.load.plan.plan_of"]


def test_imports_inside_functions_are_heavy_and_say_why() -> None:
    heavy = _heavy_modules(_edges())
    bad = []
    for i in imports():
        if not i.in_function:
            continue
        # importing a.b.c runs a.b's __init__ first: a heavy parent package makes the import heavy
        chain = {i.target} | {i.target.rsplit(".", n)[0] for n in range(1, i.target.count("."))}
        if i.target not in HEAVY and not chain & heavy:
            bad.append(f"{i.source}:{i.line} imports {i.target} inside a function; import it at the top")
        elif not i.reason:
            bad.append(f"{i.source}:{i.line} imports {i.target} inside a function without '# lazy: reason'")
    assert bad == []


def _bound_names(init: Path) -> set[str]:
    """The public names a package's __init__ binds at its top level (imports, defs, assignments). A lazy package
    (PEP 562: a `_LAZY` table, its imports under `if TYPE_CHECKING:` for the type checker) binds the names of
    that block, which must be the table's."""
    out: set[str] = set()
    body = ast.parse(init.read_text()).body
    typing_only = [n for n in body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    if typing_only:
        lazy = next(
            n.value
            for n in body
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in n.targets)
        )
        assert isinstance(lazy, ast.Dict)
        table = {k.value for k in lazy.keys if isinstance(k, ast.Constant)}
        body = [x for n in typing_only for x in n.body]
        typed = {a.asname or a.name for x in body if isinstance(x, ast.ImportFrom) for a in x.names}
        assert typed == table, f"{init}: _LAZY and the TYPE_CHECKING imports differ: {sorted(typed ^ table)}"
    for n in body:
        if isinstance(n, ast.ImportFrom):
            out |= {a.asname or a.name for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(n.name)
        elif isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return {x for x in out if not x.startswith("_") and x != "annotations"}


@pytest.mark.parametrize("pkg", ["case", "datasets", "ledger", "load", "metrics", "services", "tools"])
def test_public_surfaces_are_sorted_complete_and_resolve(pkg: str) -> None:
    import importlib

    m = importlib.import_module(f"caseledger.{pkg}")
    names = list(m.__all__)
    # ruff's order (RUF022): CONSTANTS, then Classes, then functions, each alphabetical
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    bound = _bound_names(ROOT / pkg / "__init__.py")
    assert set(names) == bound, (
        f"re-exported but not in __all__: {sorted(bound - set(names))}; in __all__ but not bound: "
        f"{sorted(set(names) - bound)}"
    )
    for n in names:  # each is the object its defining module holds, not a stale copy
        obj = getattr(m, n)
        home = getattr(obj, "__module__", None)
        if isinstance(home, str) and home.startswith("caseledger.") and hasattr(importlib.import_module(home), n):
            assert getattr(importlib.import_module(home), n) is obj, f"caseledger.{pkg}.{n}"


# Functions a screen long: no function or method in caseledger/ over this many lines (decorators excluded, the
# docstring included). Exceptions name file:function and say why; none is permanent: drop an entry once its
# function is split (a stale entry is not an error, so branches that split them merge in any order).
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}  # 'module.py:function' -> why it stays longer (none now)


def _long_functions(root: Path, limit: int) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno is not None:
                length = n.end_lineno - n.lineno + 1
                if length > limit:
                    out.append(f"{rel}:{n.name} ({length} lines, from line {n.lineno})")
    return out


def test_no_function_is_over_eighty_lines() -> None:
    long = _long_functions(ROOT, MAX_FUNCTION_LINES)
    bad = [f for f in long if f.split(" ")[0] not in LONG_FUNCTIONS_ALLOWED]
    assert bad == [], f"split these along their seams (over {MAX_FUNCTION_LINES} lines): {bad}"


def test_the_long_function_finder_names_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(81))
    (tmp_path / "m.py").write_text(
        f"def short() -> None:\n    pass\n\n\nclass K:\n    def long(self) -> None:\n{body}\n"
    )
    assert _long_functions(tmp_path, 80) == ["m.py:long (82 lines, from line 6)"]


# Test files a reader can hold: no tests/*.py over this many lines. A longer one is split along its sections, what
# the parts share goes to tests/helpers.py (fixtures to tests/conftest.py), and a test module imports no other.
MAX_TEST_FILE_LINES = 800
TESTS = Path(__file__).resolve().parent


def _long_files(root: Path, limit: int) -> list[str]:
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(root.glob("*.py"))}
    return [f"{name} ({n} lines)" for name, n in sizes.items() if n > limit]


def test_no_test_file_is_over_eight_hundred_lines() -> None:
    long = _long_files(TESTS, MAX_TEST_FILE_LINES)
    assert long == [], f"split these along their sections (over {MAX_TEST_FILE_LINES} lines): {long}"


def test_the_long_file_finder_names_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * 801)
    (tmp_path / "full.py").write_text("x = 1\n" * 800)
    assert _long_files(tmp_path, 800) == ["long.py (801 lines)"]


def _test_module_imports(root: Path) -> list[str]:
    """Imports of a test module by a test module (what they share belongs in tests/helpers.py)."""
    out = []
    for path in sorted(root.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names += [f"tests.{a.name}" for a in node.names] if node.module == "tests" else [node.module]
            out += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.startswith("tests.test_")]
    return out


def test_no_test_module_imports_another() -> None:
    bad = _test_module_imports(TESTS)
    assert bad == [], "move what they share to tests/helpers.py:\n" + "\n".join(bad)


def test_the_test_import_finder_names_each_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("import tests.test_b\n\n\ndef f() -> None:\n    from tests.test_c import x\n")
    (tmp_path / "test_d.py").write_text("from tests.helpers import wait_until\nfrom tests import conftest, test_e\n")
    assert _test_module_imports(tmp_path) == [
        "test_a.py:1 imports tests.test_b",
        "test_a.py:5 imports tests.test_c",
        "test_d.py:2 imports tests.test_e",
    ]


# What each fresh interpreter of a run may not load at start-up: a campaign point pays these processes' imports in
# series around its formal window (bench/bench_imports.py). The collector computes with numpy; none needs httpx2's
# async client except the controller, whose health probes use it.
LIGHT_ENTRIES = {
    "caseledger.run.controller": {"numpy", "matplotlib", "mcp", "transformers", "tokenizers"},
    "caseledger.run.preflight": {"numpy", "httpx2", "matplotlib", "mcp", "transformers", "tokenizers"},
    "caseledger.load.__main__": {"numpy", "httpx2", "matplotlib", "mcp", "transformers", "tokenizers"},
    "caseledger.metrics.__main__": {"httpx2", "matplotlib", "mcp", "transformers", "tokenizers"},
}


@pytest.mark.integration
@pytest.mark.parametrize("entry", sorted(LIGHT_ENTRIES))
def test_a_run_process_imports_only_what_its_phase_uses(entry: str) -> None:
    import subprocess
    import sys

    code = f"import sys, {entry}; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT.parent
    ).stdout
    assert sorted(set(out.split()) & LIGHT_ENTRIES[entry]) == []


@pytest.mark.integration
def test_an_ssh_process_starts_quietly_under_warnings_as_errors() -> None:
    """A process that opens SSH imports asyncssh; cryptography >= 51 warns there about DSA. caseledger silences
    that one warning (its logs stay clean and `-W error` runs), and only that one: the mutation "filter
    removed" fails here with cryptography >= 51."""
    import subprocess
    import sys

    code = "import caseledger, asyncssh, warnings; warnings.warn('kept', UserWarning)"
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True)
    assert "DSA" not in done.stderr
    assert "UserWarning: kept" in done.stderr  # other warnings still raise


def _private_reaches(modules: dict[str, Path]) -> list[str]:
    """Where a module of caseledger/ reaches into another one's private name: `from caseledger.x import _y`, or
    `x._y` with `x` bound to an imported caseledger module. A private module (a package's `_store.py`) is a
    module, not a name, and an alias (`import lengths as _lengths`) names a module: neither is a reach."""
    out = []
    for mod, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        bound: dict[str, str] = {}  # local name -> the caseledger module it holds

        def private(name: str, home: str) -> bool:
            return name.startswith("_") and not name.endswith("__") and f"{home}.{name}" not in modules

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:  # `import a.b.c` binds a; `import a.b.c as x` binds x to a.b.c
                    if a.name in modules:
                        bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg) + (f".{node.module}" if node.module else "")
                if base.split(".")[0] != "caseledger":
                    continue
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        bound[a.asname or a.name] = f"{base}.{a.name}"
                    elif private(a.name, base):
                        out.append(f"{mod}:{node.lineno} imports {base}.{a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr, "?"):
                dotted = ast.unparse(node.value)
                head, _, rest = dotted.partition(".")
                home = bound.get(head)
                target = f"{home}.{rest}" if home and rest else home
                if target in modules and target != mod and private(node.attr, target):
                    out.append(f"{mod}:{node.lineno} uses {target}.{node.attr}")
    return out


def test_no_module_reaches_into_another_modules_private_names() -> None:
    bad = _private_reaches(MODULES)
    assert bad == [], "make each name public (drop the underscore) or keep it inside its module:\n" + "\n".join(bad)


def test_the_private_reach_finder_names_each_kind_of_reach(tmp_path: Path) -> None:
    pkg = tmp_path / "caseledger"
    (pkg / "run").mkdir(parents=True)
    (pkg / "run" / "a.py").write_text("_x = 1\n_T = 2\n__all__ = ['y']\n")
    (pkg / "run" / "_store.py").write_text("")
    (pkg / "run" / "b.py").write_text(
        "from caseledger.run.a import _x\n"
        "from caseledger.run import a, _store\n"
        "from caseledger.run import a as _a\n"
        "import caseledger.run.a\n"
        "print(a._T, _a._x, a.__all__, _store, caseledger.run.a._x, _a.y, self._z)\n"
    )
    mods = {
        "caseledger.run.a": pkg / "run" / "a.py",
        "caseledger.run._store": pkg / "run" / "_store.py",
        "caseledger.run.b": pkg / "run" / "b.py",
    }
    assert _private_reaches(mods) == [
        "caseledger.run.b:1 imports caseledger.run.a._x",
        "caseledger.run.b:5 uses caseledger.run.a._T",
        "caseledger.run.b:5 uses caseledger.run.a._x",
        "caseledger.run.b:5 uses caseledger.run.a._x",
    ]


def _private_module_imports(modules: dict[str, Path]) -> list[str]:
    """Imports of a package's private module (`caseledger.metrics._models`) from outside that package."""
    out = []
    for mod, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                parts = name.split(".")
                at = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.endswith("__")), None)
                if parts[0] == "caseledger" and at is not None and not f"{mod}.".startswith(".".join(parts[:at]) + "."):
                    out.append(f"{mod}:{node.lineno} imports {name}")
    return out


def test_private_modules_are_imported_only_inside_their_package() -> None:
    """A package's public surface is its __init__ (metrics resolves its names lazily, so no import costs more)."""
    bad = _private_module_imports(MODULES)
    assert bad == [], "import the name from the package instead:\n" + "\n".join(bad)
