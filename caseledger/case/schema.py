"""JSON Schema files generated from the pydantic models (the models are the source)."""

from __future__ import annotations

from pathlib import Path

import orjson

from caseledger.case.model import Case

SCHEMAS_DIR = Path(__file__).resolve().parent.parent.parent / "schemas"


def case_schema() -> bytes:
    schema = Case.model_json_schema(by_alias=True)
    schema["$id"] = "https://caseledger.invalid/schemas/case.schema.json"
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def write_schemas(out_dir: Path = SCHEMAS_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / "case.schema.json"
    p.write_bytes(case_schema())
    return [p]
