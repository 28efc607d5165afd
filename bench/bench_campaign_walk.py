"""The walk of a campaign id through the code: which rooms (modules, and their packages) it enters and how often it
climbs back up the layers (tests/test_layout.py STAGES, lowest first). By hand:
`.venv/bin/python bench/bench_campaign_walk.py` (about 15 s; it measures structure, not time, so a busy host only
makes it slower).

Dynamic walk: a grid campaign of 3 points (the control measured twice) on the reference target, driven the way an
agent drives it through the tool functions (freeze_case, start_run, phase_status until complete, summarize), with
the run's parts in this process (procs.in_process(), as the tests run them: the driver, controllers, preflight,
load client and collector are traced here too). sys.setprofile and threading.setprofile record, per thread and
in order, each call of a caseledger function one of whose arguments (its parameters' values at the call:
positional, keyword, *args, **kwargs, and a closure's free variables) is the campaign id: a str equal to it, a
list/tuple/set holding it, or an object whose own attributes `campaign_id` or `id` equal it. Paths that contain
the id do not count. Consecutive calls in the same module are one step. Printed, each as distinct (from, to)
module pairs with how often each was taken and the functions entered:

- rooms: the distinct modules on the walk (and their packages);
- doors: the id goes from the module of the nearest traced call still open above a traced call into its module;
- CLIMBS: the doors into a higher stage (the id handed up a layer: a callback or an injected function);
- flat climbs: consecutive steps of a thread's walk, in time order, into a higher stage; a return to the caller's
  room and its next call count too, so a module that calls two lower ones in turn climbs once per return;
- upward calls: a traced call whose calling caseledger frame, traced or not, is of a lower stage.

Static walk, for comparison: from every function of caseledger/tools/campaigns.py with a parameter named
campaign_id, campaign, camp, cid or gid, the calls (resolved through each module's imports, functions and lazy
re-exports) to functions that also have one, followed transitively: the modules reached and the doors that go up
(test_layout forbids upward imports, so a static climb could only come from a lazy import).
"""

from __future__ import annotations

import ast
import itertools
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from caseledger import procs, services
from caseledger.ledger import authorization
from caseledger.tools import freeze_any, start_any, summarize
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port
from tests.helpers import knee_campaign, until_complete
from tests.test_layout import LAZY, MODULES, RANK

ID_PARAMS = {"campaign_id", "campaign", "camp", "cid", "gid"}
ENTRY = "caseledger.tools.campaigns"


def stage(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def up(a: str, b: str) -> bool:
    return RANK[stage(b)] > RANK[stage(a)]


# ------------------------------------------------------------------------------------------- the dynamic walk


class Tracer:
    """Per thread, the caseledger calls whose arguments carry the campaign id, in order: (module, function, the
    module of the nearest caseledger frame that calls it, the module of the nearest traced call above it)."""

    def __init__(self, gid: str) -> None:
        self.gid = gid
        self.calls: dict[int, list[tuple[str, str, str | None, str | None]]] = {}
        self.open: dict[int, list[tuple[FrameType, str]]] = {}  # per thread, the traced calls not yet returned

    def carries(self, v: object) -> bool:
        if isinstance(v, str):
            return v == self.gid
        if isinstance(v, list | tuple | set | frozenset):
            return any(isinstance(x, str) and x == self.gid for x in v)
        own = getattr(v, "__dict__", None)  # the instance's own attributes: no property runs
        return isinstance(own, dict) and self.gid in (own.get("campaign_id"), own.get("id"))

    def args(self, frame: FrameType) -> Iterator[object]:
        """The parameters' values, and a closure's free variables (a lambda handed on carries what it binds)."""
        co, loc = frame.f_code, frame.f_locals
        n = co.co_argcount + co.co_kwonlyargcount
        for name in (*co.co_varnames[:n], *co.co_freevars):
            yield loc.get(name)
        for name in co.co_varnames[n : n + bool(co.co_flags & 4) + bool(co.co_flags & 8)]:  # *args, **kwargs
            v = loc.get(name)
            yield from (v.values() if isinstance(v, dict) else v or ())

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "return":
            stack = self.open.get(threading.get_ident())
            if stack and stack[-1][0] is frame:
                stack.pop()
            return
        if event != "call":
            return
        mod = frame.f_globals.get("__name__", "")
        if mod not in MODULES or not any(self.carries(v) for v in self.args(frame)):
            return
        caller, f = None, frame.f_back
        while f is not None and caller is None:
            m = f.f_globals.get("__name__", "")
            caller, f = (m if m in MODULES else None), f.f_back
        stack = self.open.setdefault(threading.get_ident(), [])
        parent = stack[-1][1] if stack else None
        stack.append((frame, mod))
        self.calls.setdefault(threading.get_ident(), []).append((mod, frame.f_code.co_name, caller, parent))


def workspace() -> Workspace:
    ws = Workspace(Path(tempfile.mkdtemp()) / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    return ws


def campaign() -> Tracer:
    """A 3-point grid campaign, freeze_case to summarize, traced whole: the id is a hash of the declaration, so a
    freeze in a scratch workspace names it before the traced freeze makes it again."""
    draft = knee_campaign(
        free_port(), [1, 2, 4], search={"kind": "grid"}, repeats={"runs": 1, "settle_runs": 1, "budget": 0}
    )
    draft["campaign"]["base"]["load"]["requests"] = 16
    scratch = freeze_any(workspace(), draft=draft)
    assert isinstance(scratch, CampaignFrozen), scratch
    tracer, ws = Tracer(scratch.campaign_id), workspace()
    try:
        with procs.in_process():
            threading.setprofile(tracer)
            sys.setprofile(tracer)
            try:
                f = freeze_any(ws, draft=draft)
                assert isinstance(f, CampaignFrozen) and f.campaign_id == tracer.gid, f
                start_any(ws, f.campaign_id)
                v = until_complete(ws, f.campaign_id)
                summarize(ws, [f.campaign_id])
            finally:
                sys.setprofile(None)
                threading.setprofile(None)
    finally:
        services.stop_all(ws)
    print(f"campaign {f.campaign_id}: {len(v.rows)} points, {v.progress['runs']} runs, {v.answer[:60]}...")
    return tracer


def walks(t: Tracer) -> list[list[str]]:
    """Each thread's walk: its modules in order, consecutive calls in one module one step."""
    return [[m for k, (m, *_) in enumerate(c) if k == 0 or c[k - 1][0] != m] for c in t.calls.values()]


def show(title: str, found: Counter[tuple[str, ...]], into: dict[tuple[str, ...], Counter[str]] | None = None) -> None:
    print(f"{title}: {len(found)} distinct, {sum(found.values())} times")
    for key, k in found.most_common():
        fns = ", ".join(f"{fn} {n}" for fn, n in (into or {}).get(key, Counter()).most_common(4))
        print(f"  {k:>4}x  {' -> '.join(key)}" + (f"  ({fns})" if fns else ""))


def tally(
    pairs: Iterator[tuple[str, str, str]],
) -> tuple[Counter[tuple[str, ...]], dict[tuple[str, ...], Counter[str]]]:
    """(from module, to module, function entered) -> how often each (from, to), and the functions entered by each."""
    found: Counter[tuple[str, ...]] = Counter()
    into: dict[tuple[str, ...], Counter[str]] = {}
    for a, b, fn in pairs:
        found[(a, b)] += 1
        into.setdefault((a, b), Counter())[fn] += 1
    return found, into


def door_climbs(t: Tracer) -> Iterator[tuple[str, str, str]]:
    return ((p, m, fn) for cs in t.calls.values() for m, fn, _, p in cs if p and up(p, m))


def tracer_sees_a_callback() -> None:
    """A low module calling back up with the id is one climb (the rule is checked before it is trusted)."""
    low: dict[str, Any] = {"__name__": "caseledger.procs"}
    exec("def low(gid, cb):\n    return cb(gid)", low)
    top: dict[str, Any] = {"__name__": "caseledger.tools.campaigns", "low": low["low"]}
    exec("def top(gid):\n    return low(gid, back)\ndef back(gid):\n    return gid", top)
    t = Tracer("g-x")
    sys.setprofile(t)
    top["top"]("g-x")
    sys.setprofile(None)
    assert list(door_climbs(t)) == [("caseledger.procs", "caseledger.tools.campaigns", "back")], t.calls


def report_dynamic(t: Tracer) -> None:
    calls = [c for cs in t.calls.values() for c in cs]
    rooms = sorted({m for m, *_ in calls}, key=lambda m: (RANK[stage(m)], m))
    print(f"threads on the walk: {len(t.calls)}; traced calls: {len(calls)}; steps: {sum(map(len, walks(t)))}")
    print(f"rooms: {len(rooms)} modules in {len({stage(m) for m in rooms})} packages")
    for m in rooms:
        print(f"  {stage(m):<10} {m}")
    show(
        "doors (the id goes from the room of the traced call above into another room)",
        *tally((p, m, fn) for m, fn, _, p in calls if p and p != m),
    )
    show("CLIMBS (a door into a higher stage)", *tally(door_climbs(t)))
    flat = ((a, b, fn) for cs in t.calls.values() for (a, *_), (b, fn, *_) in itertools.pairwise(cs) if up(a, b))
    show("flat climbs (consecutive steps in time order, a return to the caller's room included)", *tally(flat))
    show(
        "upward calls (the calling frame, traced or not, is of a lower stage)",
        *tally((c, m, fn) for m, fn, c, _ in calls if c and up(c, m)),
    )


# ------------------------------------------------------------------------------------------- the static walk


class Module:
    """One module's functions (name -> parameter names) and what its names resolve to: a module, or (module, name)."""

    def __init__(self, mod: str, path: Path) -> None:
        tree = ast.parse(path.read_text())
        self.funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.names: dict[str, str | tuple[str, str]] = {}
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.funcs.setdefault(node.name, node)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*pkg.split(".")[: len(pkg.split(".")) - node.level + 1], base]).strip(".")
                for a in node.names:
                    full = f"{base}.{a.name}"
                    self.names[a.asname or a.name] = full if full in MODULES else (base, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in MODULES:
                        self.names[a.asname] = a.name
        for name, where in LAZY.get(mod, {}).items():
            self.names.setdefault(name, (where, name))


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def resolve(mods: dict[str, Module], mod: str, name: str, depth: int = 0) -> tuple[str, str] | None:
    """The (module, function) a name in `mod` means, following re-exports; None outside caseledger's functions."""
    m = mods.get(mod)
    if m is None or depth > 5:
        return None
    if name in m.funcs:
        return mod, name
    where = m.names.get(name)
    return resolve(mods, *where, depth=depth + 1) if isinstance(where, tuple) else None


def callees(mods: dict[str, Module], mod: str, fn: ast.AST) -> Iterator[tuple[str, str]]:
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            hit = resolve(mods, mod, f.id)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            target = mods[mod].names.get(f.value.id)
            hit = resolve(mods, target, f.attr) if isinstance(target, str) else None
        else:
            hit = None
        if hit is not None:
            yield hit


def report_static() -> None:
    mods = {m: Module(m, p) for m, p in MODULES.items()}
    carries = {(m, n) for m, mm in mods.items() for n, fn in mm.funcs.items() if params(fn) & ID_PARAMS}
    todo = sorted((m, n) for m, n in carries if m == ENTRY)
    seen, edges = set(todo), Counter[tuple[str, ...]]()
    while todo:
        m, n = todo.pop()
        for hit in callees(mods, m, mods[m].funcs[n]):
            if hit not in carries:
                continue
            if hit[0] != m:
                edges[(m, hit[0])] += 1
            if hit not in seen:
                seen.add(hit)
                todo.append(hit)
    rooms = {m for m, _ in seen}
    upward = [e for e in edges if up(*e)]
    print(f"static: {len(seen)} functions in {len(rooms)} modules, {len({stage(m) for m in rooms})} packages")
    for m in sorted(rooms, key=lambda m: (RANK[stage(m)], m)):
        print(f"  {stage(m):<10} {m}")
    show("static doors (calls between modules)", edges)
    print(f"static climbs (doors into a higher stage): {len(upward)} {upward}")


def main() -> None:
    tracer_sees_a_callback()
    report_dynamic(campaign())
    print()
    report_static()


if __name__ == "__main__":
    main()
