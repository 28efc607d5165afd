"""What the MCP server publishes before any tool runs, without importing the tools.

A session's `initialize` and `tools/list` need the decision words, the id and name patterns, the native window
rules and summarize's output schema; their sources (caseledger.tools, .metrics, .outcome, .case.model) pull numpy,
the index and every result model: about a second of imports no session start should pay. So the server reads them
from here: the names and bounds come from caseledger.records (light, their one source), and the generated parts
(decision words, output schemas) are in caseledger/data/mcp_published.json. tests/test_mcp_start.py fails when the
file differs from its source; regenerate it with `caseledger schema --package` (in a source checkout).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from caseledger.records import RATIO_MAX as RATIO_MAX  # re-exported: one light source
from caseledger.records import RATIO_MIN_EXCLUSIVE as RATIO_MIN_EXCLUSIVE
from caseledger.records import SCENARIO_PATTERN as SCENARIO_PATTERN
from caseledger.records import NativeRule as NativeRule

PUBLISHED_FILE = Path(__file__).resolve().parent.parent / "data" / "mcp_published.json"


# Tools whose output schema is published in tools/list: summarize's typed rows, with the decision words. The
# other answers say everything in their short text ('next: ...') and still carry their structured content
# (validated against their models by the server); listing their ~30 field names and types in every session
# cost 2.5 KB of tokens for no information the text does not give.
PUBLISHED_OUTPUTS = ("summarize",)


class Published(BaseModel):
    """The generated part: the decision words (server instructions) and the published output schemas."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision_words: str
    outputs: dict[str, dict[str, Any]]  # JSON: Schema documents, published as-is to clients


@functools.cache
def published() -> Published:
    """The generated part, read once per process."""
    return Published.model_validate_json(PUBLISHED_FILE.read_bytes())


def compact_schema(schema: Any, *, drop_defaults: bool = False) -> Any:
    """The same JSON Schema in fewer bytes: no generated titles, `{"type": [X, "null"]}` for an optional
    scalar or array instead of anyOf, (output schemas) no defaults."""
    if isinstance(schema, list):
        return [compact_schema(x, drop_defaults=drop_defaults) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}  # JSON: a Schema node being rewritten
    for key, value in schema.items():
        if key in ("properties", "$defs") and isinstance(value, dict):  # keys here are names, not keywords
            out[key] = {k: compact_schema(v, drop_defaults=drop_defaults) for k, v in value.items()}
        elif (key == "title" and isinstance(value, str)) or (key == "default" and drop_defaults) or key == "examples":
            # examples: every description already shows one ("e.g. ...")
            continue
        else:
            out[key] = compact_schema(value, drop_defaults=drop_defaults)
    arms = out.get("anyOf")
    if isinstance(arms, list) and len(arms) == 2 and {"type": "null"} in arms:
        other = next(a for a in arms if a != {"type": "null"})
        if isinstance(other, dict) and isinstance(other.get("type"), str) and not set(other) & set(out):
            del out["anyOf"]
            out = {**other, **out, "type": [other["type"], "null"]}
    return out


def shallow_output(schema: dict[str, Any]) -> dict[str, Any]:  # JSON: a Schema document in and out
    """An output schema one level deep: every top-level field with its type and description, nested models as
    plain objects (the structured content carries them in full; the server validates it against the model).
    Keeps tools/list small: the full schemas of nested rows would triple it."""

    def flat(prop: Any) -> Any:
        if not isinstance(prop, dict):
            return prop
        out = {k: v for k, v in prop.items() if k not in ("$ref", "anyOf", "items", "allOf")}
        if "$ref" in prop or "allOf" in prop:
            out["type"] = "object"
        arms = prop.get("anyOf")
        if isinstance(arms, list):
            kinds = [a.get("type", "object") if isinstance(a, dict) else "object" for a in arms]
            out["type"] = [k for k in dict.fromkeys(str(k) for k in kinds)]
        if isinstance(prop.get("items"), dict):
            items = prop["items"]
            out["items"] = {"type": "object"} if "$ref" in items or "anyOf" in items else items
        return out

    return {
        k: ({n: flat(v) for n, v in schema["properties"].items()} if k == "properties" else v)
        for k, v in schema.items()
        if k not in ("$defs", "required")
    }  # every field is always present


def generate() -> Published:
    """The generated part computed from its sources now (imports the tools: for the test and the regeneration).
    An output schema is derived as the SDK derives it from a tool's return annotation, then compacted as tools/list
    shows it."""
    from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata  # lazy: only to generate

    from caseledger.outcome.decide import DECISION_WORDS  # lazy: numpy, the result models (see the docstring)
    from caseledger.tools import SummaryResult

    models = {"summarize": SummaryResult}
    outputs = {}
    for name in PUBLISHED_OUTPUTS:
        derived = FuncMetadata(arg_model=ArgModelBase, output_model=models[name]).output_schema
        outputs[name] = shallow_output(compact_schema(derived, drop_defaults=True))
    return Published(decision_words=DECISION_WORDS, outputs=outputs)


def encode(p: Published) -> bytes:
    """The file's bytes: indented (a diff shows what changed), keys in the order tools/list sends them."""
    return orjson.dumps(p.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n"


def write_published() -> Path:
    """Regenerate caseledger/data/mcp_published.json (`caseledger schema --package` does, in a source checkout)."""
    PUBLISHED_FILE.write_bytes(encode(generate()))
    return PUBLISHED_FILE
