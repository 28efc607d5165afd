"""Freezing and loading cases: validate, canonicalise, hash, store read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from caseledger.case.model import Case
from caseledger.errors import CaseInvalid, NotFound
from caseledger.workspace import Workspace, atomic_write, canonical_json, check_id, sha256_bytes


def explain(err: ValidationError, source: str) -> CaseInvalid:
    """One line per invalid field: path, problem, the given value."""
    lines = []
    for e in err.errors()[:8]:
        path = ".".join(str(p) for p in e["loc"]) or "(case)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (remove it or check the spelling against schemas/case.schema.json)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        given = e.get("input")
        shown = "" if e["type"] in ("missing",) or isinstance(given, dict) else f" (got {given!r})"[:80]
        lines.append(f"{path}: {msg}{shown}")
    more = f" (+{len(err.errors()) - 8} more)" if len(err.errors()) > 8 else ""
    return CaseInvalid(f"{source} is not a valid case: " + "; ".join(lines) + more,
                       "fix these fields in the draft and freeze again; nothing was written")


def parse_draft(data: bytes, source: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise CaseInvalid(f"{source} is not valid JSON: {e}", "fix the JSON syntax and freeze again") from None
    if not isinstance(obj, dict):
        raise CaseInvalid(f"{source} must hold a JSON object (a case), got {type(obj).__name__}",
                          "write the case as one JSON object")
    return obj


def validate(obj: dict[str, Any], source: str) -> Case:
    try:
        return Case.model_validate(obj).filled()
    except ValidationError as e:
        raise explain(e, source) from None


def case_id_of(case: Case) -> str:
    return "c-" + sha256_bytes(canonical_json(case.canonical()))[:12]


def load_case(ws: Workspace, case_id: str) -> Case:
    path = ws.frozen_case(case_id)
    if not path.exists():
        raise NotFound(f"case_id '{case_id}' is not frozen in {ws.frozen_dir}",
                       "freeze the draft first: freeze_case(path=...) returns the case_id")
    return Case.model_validate(orjson.loads(path.read_bytes()))


def store(ws: Workspace, case: Case) -> tuple[str, bool]:
    """Store read-only under the content hash; (case_id, created)."""
    cid = case_id_of(case)
    path = ws.frozen_case(cid)
    if path.exists():
        return cid, False
    atomic_write(path, orjson.dumps(case.canonical(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n",
                 mode=0o444)
    return cid, True


def read_draft(ws: Workspace, path: str | Path) -> tuple[dict[str, Any], str]:
    p = Path(path)
    if not p.is_absolute():
        p = (Path.cwd() / p) if (Path.cwd() / p).exists() else ws.root / p
    if not p.exists():
        raise NotFound(f"draft '{path}' does not exist", "give the path of a case JSON file (see cases/)")
    return parse_draft(p.read_bytes(), str(path)), str(p)


def check_parent(ws: Workspace, parent: str | None) -> Case | None:
    if parent is None:
        return None
    check_id(parent, "parent", "c")
    return load_case(ws, parent)
