"""JSON Schema files generated from the pydantic models (the models are the source).

The case schema ships with the package (caseledger/data/schemas/, a test fails when it is stale), so a workspace
anywhere gets it: `caseledger init` copies it into the workspace's schemas/, where the drafts' `"$schema":
"../schemas/case.schema.json"` finds it, and `caseledger schema` writes it there again from the models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from caseledger.case.model import Case

CASE_SCHEMA = "case.schema.json"
PACKAGED_SCHEMAS = Path(__file__).resolve().parent.parent / "data" / "schemas"  # package data, shipped


def case_schema() -> bytes:
    schema = Case.model_json_schema(by_alias=True)
    schema["$id"] = "https://caseledger.invalid/schemas/case.schema.json"
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


SECTIONS = ("target", "service", "dataset", "load", "measurement", "decision")  # one resource each, besides the rest
INDEX_URI = "caseledger://schema/case"
SECTION_URI = "caseledger://schema/case/{section}"


def _refs(node: Any) -> set[str]:  # JSON: a schema node
    if isinstance(node, dict):
        ref = node.get("$ref")
        own = {ref.rsplit("/", 1)[-1]} if isinstance(ref, str) else set()
        return own.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def section_schema(section: str) -> bytes:
    """One top-level field of a case draft as a schema of its own, with only the definitions it uses ('all':
    the whole schema, as schemas/case.schema.json holds it). KeyError naming the known sections."""
    full = Case.model_json_schema(by_alias=True)
    if section == "all":
        return case_schema()
    props = full["properties"]
    if section not in props:
        raise KeyError(f"no case section '{section[:64]}'; known: {', '.join(sorted(props))}, all")
    node: dict[str, Any] = dict(props[section])  # JSON: a schema node
    defs: dict[str, Any] = full.get("$defs", {})  # JSON: the schema's definitions
    ref = node.pop("$ref", "").rsplit("/", 1)[-1]
    if ref in defs:  # the section's own model at the root, its description kept
        node = {**defs[ref], **node}
    need, todo = set(), _refs(node) - {ref}
    while todo:
        name = todo.pop()
        if name not in need and name in defs:
            need.add(name)
            todo |= _refs(defs[name])
    if need:
        node["$defs"] = {k: defs[k] for k in sorted(need)}
    node["$id"] = f"https://caseledger.invalid/schemas/case/{section}.schema.json"
    return orjson.dumps(node, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def schema_index() -> bytes:
    """The case schema in short: each top-level field with its description, whether a draft must give it, its
    own fields' names and the resource that holds its whole schema (SECTION_URI). A few KB, where the whole
    schema is ~70 KB."""
    full = Case.model_json_schema(by_alias=True)
    defs: dict[str, Any] = full.get("$defs", {})  # JSON: the schema's definitions
    required = set(full.get("required", []))
    out: dict[str, Any] = {}  # JSON: the index's sections
    for name, node in full["properties"].items():
        ref = next(iter(_refs(node)), None) if "$ref" in str(node) else None
        target = defs.get(ref, {}) if ref else {}
        said = node.get("description") or target.get("description") or ""
        entry: dict[str, Any] = {"description": said[:200]}  # JSON: one section of the index
        entry["required"] = name in required
        if target.get("properties"):
            entry["fields"] = sorted(target["properties"])
            entry["schema"] = SECTION_URI.format(section=name)
        out[name] = entry
    doc = {
        "title": "caseledger case draft (index)",
        "sections": out,
        "whole": SECTION_URI.format(section="all"),
        "file": "schemas/case.schema.json (for an editor: every field with its bounds)",
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def write_schemas(out_dir: Path) -> list[Path]:
    """The schema files generated now, written into out_dir (a workspace's schemas/, or the package's own)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / CASE_SCHEMA
    p.write_bytes(case_schema())
    return [p]
