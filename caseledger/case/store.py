"""Freezing and loading cases: validate, canonicalise, hash, store read-only."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from caseledger import redact
from caseledger.case.bounds import PATTERN_RULES
from caseledger.case.dataset import LENGTH_TAGS
from caseledger.case.decision import Decision
from caseledger.case.launch import launch_problem
from caseledger.case.model import LINEAGE_FIELDS, Case
from caseledger.errors import CaseInvalid, NotFound, quoted
from caseledger.records import read_jsonl
from caseledger.workspace import (
    Workspace,
    atomic_write,
    canonical_json,
    check_id,
    exists,
    read_file_field,
    resolve_path,
    sha256_bytes,
    utc_now,
)


def explain(err: ValidationError, source: str, what: str = "case") -> CaseInvalid:
    """One line per invalid field: path, problem, the given value."""
    lines = []
    for e in err.errors()[:8]:
        # a length field's branch tag ('tokens', 'distribution') is no part of the field's path
        path = ".".join(str(p) for p in e["loc"] if p not in LENGTH_TAGS) or "(case)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (remove it or check the spelling against schemas/case.schema.json)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "int_type" and isinstance(e.get("input"), bool):
            msg = "must be an integer, not a boolean"
        elif e["type"] == "int_type" and isinstance(e.get("input"), float):
            msg = "must be an integer written without a decimal point or exponent"
        elif e["type"] == "finite_number":
            msg = "must be a finite number (NaN and Infinity are not numbers)"
        elif e["type"] == "string_pattern_mismatch" and (e.get("ctx") or {}).get("pattern") in PATTERN_RULES:
            msg = PATTERN_RULES[e["ctx"]["pattern"]]
        given = e.get("input")
        shown = "" if e["type"] in ("missing",) or isinstance(given, dict) else f" (got {given!r})"[:80]
        lines.append(f"{path}: {msg}{shown}")
    more = f" (+{len(err.errors()) - 8} more)" if len(err.errors()) > 8 else ""
    return CaseInvalid(
        f"{source} is not a valid {what}: " + "; ".join(lines) + more,
        "fix these fields in the draft and freeze again; nothing was written",
    )


_INT_RANGE = (-(2**63), 2**64 - 1)  # what orjson reads as an integer; beyond it, silently a float
_LONG_DIGITS = re.compile(rb"\d{19}")  # every integer beyond 64 bits has at least 19 digits


class _Refused:
    """A JSON literal no case field can hold, kept in place by the second parse so its field path is known."""

    def __init__(self, literal: str, problem: str, fix: str) -> None:
        self.literal, self.problem, self.fix = literal, problem, fix


def _finite(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(text, "is not a finite number", "write a finite number")


def _int64(text: str) -> int | _Refused:
    if len(text.lstrip("-")) <= 20 and _INT_RANGE[0] <= (value := int(text)) <= _INT_RANGE[1]:
        return value
    return _Refused(text, "is an integer beyond 64 bits", "write an integer within the field's documented bound")


def _first_refused(node: Any, path: str) -> tuple[str, _Refused] | None:
    if isinstance(node, _Refused):
        return path or "(case)", node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        found = _first_refused(child, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def _refuse_literals(data: bytes, source: str) -> None:
    """Raise CaseInvalid naming the field of a NaN/Infinity literal, a float overflowing to infinity (1e400)
    or an integer beyond 64 bits; return when there is none (or the text is not JSON at all)."""
    try:
        obj = json.loads(
            data,
            parse_constant=lambda c: _Refused(c, "is not a JSON number", "write a finite number"),
            parse_float=_finite,
            parse_int=_int64,
        )
    except (ValueError, RecursionError):
        return
    found = _first_refused(obj, "")
    if found is not None:
        path, bad = found
        shown = bad.literal if len(bad.literal) <= 24 else bad.literal[:20] + "..."
        raise CaseInvalid(
            f"{source} is not a valid case: {path}: {shown} {bad.problem}",
            f"{bad.fix} for {path} (bounds: schemas/case.schema.json) and freeze again; nothing was written",
        )


def parse_draft(data: bytes, source: str) -> dict[str, Any]:  # JSON: a case draft
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        _refuse_literals(data, source)  # NaN, Infinity, 1e400: name the field rather than a column
        raise CaseInvalid(f"{source} is not valid JSON: {e}", "fix the JSON syntax and freeze again") from None
    if _LONG_DIGITS.search(data):
        _refuse_literals(data, source)
    if not isinstance(obj, dict):
        raise CaseInvalid(
            f"{source} must hold a JSON object (a case), got {type(obj).__name__}", "write the case as one JSON object"
        )
    return obj


# A value a template left for its user (`caseledger init` writes them): "<FILL: what to put here>". A draft holding
# one is refused at freeze, naming each field, before anything is validated, materialized or written.
FILL_MARK = "<FILL:"


def unfilled(obj: Any, path: str = "") -> list[tuple[str, str]]:  # JSON: a draft, walked
    """(field path, value) of every string that still holds FILL_MARK, in document order."""
    if isinstance(obj, str):
        return [(path or "(draft)", obj)] if FILL_MARK in obj else []
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in unfilled(v, f"{path}.{k}" if path else str(k))]
    if isinstance(obj, list):
        return [x for i, v in enumerate(obj) for x in unfilled(v, f"{path}[{i}]")]
    return []


def refuse_unfilled(obj: Any, source: str) -> None:  # JSON: a draft
    """CaseInvalid naming every field of the draft that still holds a template's <FILL: ...> value."""
    left = unfilled(obj)
    if not left:
        return
    shown = "; ".join(f"{path} = {quoted(value, 90)}" for path, value in left[:6])
    more = f" (+{len(left) - 6} more)" if len(left) > 6 else ""
    raise CaseInvalid(
        f"{source} still has {len(left)} value(s) to fill: {shown}{more}",
        "replace each '<FILL: ...>' value with yours (what each field means: caseledger's docs/engines.md) and "
        "freeze again; nothing was written",
    )


def validate(obj: dict[str, Any], source: str) -> Case:  # JSON: a case draft
    """The draft as a filled case; CaseInvalid naming the field and the fix, also for a service the OS could not
    start (argv and environment over execve's limits: case/launch.py)."""
    try:
        case = Case.model_validate(obj).filled()
    except ValidationError as e:
        raise explain(e, source) from None
    problem = launch_problem(case)
    if problem is not None:
        raise CaseInvalid(f"{source} is not a valid case: {problem[0]}", problem[1])
    redact.remember(case.env_names())  # its secrets' values are masked in whatever this process shows
    return case


def case_id_of(case: Case) -> str:
    """The id of what a case measures (parent and note are lineage, not identity)."""
    return "c-" + sha256_bytes(canonical_json(case.measured()))[:12]


def legacy_id_of(case: Case) -> str:
    """The id frozen cases had before lineage left the hash (parent and note included): old ids resolve."""
    return "c-" + sha256_bytes(canonical_json(case.canonical()))[:12]


def decided_id_of(case: Case) -> str:
    """The id frozen cases had before the decision left the hash (lineage out, decision in): old ids resolve."""
    data = {k: v for k, v in case.canonical().items() if k not in LINEAGE_FIELDS}
    return "c-" + sha256_bytes(canonical_json(data))[:12]


def is_case_id_of(case: Case, case_id: str) -> bool:
    return case_id in (case_id_of(case), decided_id_of(case), legacy_id_of(case))


def _frozen_as_stored(path: Path, case_id: str) -> Case | None:
    """The frozen case at `path` when its content still hashes to `case_id`, else None (edited or damaged)."""
    try:
        case = Case.model_validate(orjson.loads(path.read_bytes()))
    except (OSError, orjson.JSONDecodeError, ValidationError):
        return None
    redact.remember(case.env_names())  # its secrets' values are masked in whatever this process shows
    return case if is_case_id_of(case, case_id) else None


_REMEMBERED: dict[str, tuple[int, int]] = {}  # frozen case file -> (mtime_ns, size) whose secrets are remembered


def remember_secrets(ws: Workspace) -> None:
    """Remember (caseledger.redact) the secret variables of every frozen case of the workspace: an answer then
    masks their values in any run's text it shows, also text an older version recorded unmasked. Each file is
    read once per process (frozen cases do not change; an edited one is read again). A directory whose mtime is
    the one last seen (and older than a second: a change in the same tick could hide) is not listed again: cases
    are written by rename (atomic_write), which changes it."""
    try:
        mtime = os.stat(ws.frozen_dir).st_mtime_ns
    except OSError:
        return
    if _REMEMBERED.get(str(ws.frozen_dir)) == (mtime, -1):
        return
    for path in ws.frozen_dir.glob("c-*.json"):
        try:
            st = path.stat()
            seen = (st.st_mtime_ns, st.st_size)
            if _REMEMBERED.get(str(path)) == seen:
                continue
            names = Case.model_validate(orjson.loads(path.read_bytes())).env_names()
        except (OSError, orjson.JSONDecodeError, ValidationError):
            continue  # damaged: the reads that need this case name it
        redact.remember(names)
        _REMEMBERED[str(path)] = seen
    if time.time_ns() - mtime > 1_000_000_000:
        _REMEMBERED[str(ws.frozen_dir)] = (mtime, -1)


def _lineage_path(ws: Workspace, case_id: str) -> Path:
    return ws.frozen_dir / f"{case_id}.lineage.jsonl"


def lineage(ws: Workspace, case_id: str) -> list[dict[str, Any]]:  # JSON: lineage.jsonl
    """Every freeze of a case: {"utc", "parent", "note", "source"}, oldest first."""
    return [r for r in read_jsonl(_lineage_path(ws, case_id)).items if isinstance(r, dict)]


def _decision_path(ws: Workspace, scenario: str) -> Path:
    return ws.scenarios_dir / scenario / "decision.jsonl"


def decision_history(ws: Workspace, scenario: str) -> list[dict[str, Any]]:  # JSON: decision.jsonl
    """Every decision recorded for a scenario ({"utc", "decision", "source"}), oldest first."""
    return [
        r
        for r in read_jsonl(_decision_path(ws, scenario)).items
        if isinstance(r, dict) and isinstance(r.get("decision"), dict)
    ]


def scenario_decision(ws: Workspace, scenario: str) -> Decision | None:
    """The scenario's current decision section (objective, window, limits, min_effect, baseline, goodput): the
    latest one a freeze recorded; None when none was recorded (cases frozen before it keep their own)."""
    for rec in reversed(decision_history(ws, scenario)):
        try:
            return Decision.model_validate(rec["decision"])
        except ValidationError:
            continue  # a damaged line: the one before it holds
    return None


def record_decision(ws: Workspace, scenario: str, decision: Decision, source: str) -> Decision | None:
    """Make `decision` the scenario's decision; returns the one it replaces (None: it was already current, or
    none was recorded). Nothing is measured again: every verdict is derived from the results when read."""
    before = scenario_decision(ws, scenario)
    if before == decision:
        return None
    path = _decision_path(ws, scenario)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(
            orjson.dumps({"utc": utc_now(), "decision": decision.model_dump(mode="json"), "source": source}) + b"\n"
        )
    return before if before is not None else Decision()


def with_current_decision(ws: Workspace, case: Case) -> Case:
    """The case under its scenario's current decision (a run's copy carries the decision of its start)."""
    current = scenario_decision(ws, case.scenario)
    return case if current is None or current == case.decision else case.model_copy(update={"decision": current})


def load_case(ws: Workspace, case_id: str) -> Case:
    """A frozen case, hash-checked at every read: an edited or damaged file is refused with the fix. Parent
    and note come from its latest freeze (lineage), so the returned case reads as the agent froze it; the
    decision is the scenario's current one (a case frozen before the decision left the id keeps its own until
    the scenario records one)."""
    path = ws.frozen_case(case_id)
    if not path.exists():
        raise NotFound(
            f"case_id '{case_id}' is not frozen in {ws.frozen_dir}",
            "freeze the draft first: freeze_case with its path returns the case_id",
        )
    case = _frozen_as_stored(path, case_id)
    if case is None:
        raise CaseInvalid(
            f"ledger/cases/{case_id}.json is damaged: its content no longer hashes to {case_id} (edited on disk)",
            "freeze the original draft again (freeze_case) to restore it; a changed case is a new draft "
            f"with parent '{case_id}'",
        )
    last = (lineage(ws, case_id) or [{}])[-1]
    if last:
        case = case.model_copy(update={k: last.get(k, getattr(case, k)) for k in LINEAGE_FIELDS})
    return with_current_decision(ws, case)


def store(ws: Workspace, case: Case, source: str = "") -> tuple[str, bool]:
    """Store what the case measures, read-only, under its hash; record its lineage (parent, note) when it
    differs from the last freeze. (case_id, created). A damaged or edited copy is restored."""
    cid = case_id_of(case)
    path = ws.frozen_case(cid)
    created = not (path.exists() and _frozen_as_stored(path, cid) is not None)
    if created:
        atomic_write(
            path, orjson.dumps(case.measured(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n", mode=0o444
        )
    past = lineage(ws, cid)
    last = past[-1] if past else {}
    # a freeze that names no parent (or no note) is a lookup for that field: it keeps the recorded one
    entry = {"parent": case.parent or last.get("parent"), "note": case.note or last.get("note") or ""}
    if not past or {k: last.get(k) for k in LINEAGE_FIELDS} != entry:
        with _lineage_path(ws, cid).open("ab") as f:
            f.write(orjson.dumps({"utc": utc_now(), **entry, "source": source}) + b"\n")
    return cid, created


def read_draft(
    ws: Workspace,
    path: str | Path,
    *,
    cwd_first: bool = True,
) -> tuple[dict[str, Any], str]:  # JSON: a case draft
    """A draft file: relative to the current directory when it exists there (cwd_first), else to the
    workspace; refused when it leaves the workspace (MCP: cwd_first=False, the server's cwd means nothing)."""
    here = resolve_path(Path.cwd(), path, "path") if cwd_first else None
    p = here if here is not None and exists(here, "path", path) else ws.inside(str(path), "path")
    if not exists(p, "path", path):
        raise NotFound(f"draft '{quoted(path)}' does not exist", "give the path of a case JSON file (see cases/)")
    return parse_draft(read_file_field(p, "path", path), quoted(path, 200)), str(p)


def check_parent(ws: Workspace, parent: str | None) -> Case | None:
    if parent is None:
        return None
    check_id(parent, "parent", "c")
    return load_case(ws, parent)
