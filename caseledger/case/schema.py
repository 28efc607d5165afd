"""JSON Schema files generated from the pydantic models (the models are the source).

The case schema ships with the package (caseledger/data/schemas/, a test fails when it is stale), so a workspace
anywhere gets it: `caseledger init` copies it into the workspace's schemas/, where the drafts' `"$schema":
"../schemas/case.schema.json"` finds it, and `caseledger schema` writes it there again from the models.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from caseledger.case.model import Case

CASE_SCHEMA = "case.schema.json"
PACKAGED_SCHEMAS = Path(__file__).resolve().parent.parent / "data" / "schemas"  # package data, shipped


def case_schema() -> bytes:
    schema = Case.model_json_schema(by_alias=True)
    schema["$id"] = "https://caseledger.invalid/schemas/case.schema.json"
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def write_schemas(out_dir: Path) -> list[Path]:
    """The schema files generated now, written into out_dir (a workspace's schemas/, or the package's own)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / CASE_SCHEMA
    p.write_bytes(case_schema())
    return [p]
