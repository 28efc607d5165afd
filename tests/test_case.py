"""The case model, the impact table, freezing, delta and plan, bad input."""

from __future__ import annotations

import os
import time
import typing
from pathlib import Path
from typing import Any

import annotated_types
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from caseledger.campaign.model import CampaignDraft
from caseledger.case.model import DEFAULT_MAX_EVENT_BYTES, Case
from caseledger.case.plan import IMPACT, Impact, impact_of
from caseledger.case.schema import CASE_SCHEMA, case_schema
from caseledger.errors import CaseInvalid, NotFound, PathEscapes
from caseledger.tools import freeze_any, freeze_case
from caseledger.workspace import Workspace
from tests.conftest import ref_draft, tree_digest, write_draft


def _leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = f.annotation
        args = typing.get_args(ann) or (ann,)
        sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None:
            out += _leaves(sub, path + ".")
        else:
            out.append(path)
    return out


def test_every_case_field_has_an_impact_class() -> None:
    leaves = _leaves(Case)
    assert "load.concurrency" in leaves and "service.reference.slots" in leaves
    for path in leaves:
        impact_of(path)  # raises KeyError when a field has no class
    assert impact_of("load.concurrency") == Impact.LOAD
    assert impact_of("service.argv") == Impact.SERVICE
    assert impact_of("measurement.native.rule") == Impact.MEASUREMENT
    assert IMPACT["parent"] is None


def test_every_field_has_a_description() -> None:
    def walk(model: type[BaseModel], prefix: str = "") -> None:
        for name, f in model.model_fields.items():
            assert f.description, f"{prefix}{name} has no description"
            for a in typing.get_args(f.annotation) or (f.annotation,):
                if isinstance(a, type) and issubclass(a, BaseModel):
                    walk(a, f"{prefix}{name}.")

    walk(Case)


def test_schema_file_is_not_stale() -> None:
    """The checkout's schemas/ (its cases/ drafts point there); the packaged copy: tests/test_init.py."""
    on_disk = (Path(__file__).resolve().parent.parent / "schemas" / CASE_SCHEMA).read_bytes()
    assert on_disk == case_schema(), "schemas/case.schema.json is stale: run `caseledger schema` in the checkout"


def test_example_drafts_point_at_the_schema_and_validate() -> None:
    drafts = sorted((Path(__file__).parent.parent / "cases").glob("*.json"))
    assert drafts
    for p in drafts:
        d = orjson.loads(p.read_bytes())
        if "campaign" in d:  # a campaign template: its base is a case draft (campaigns have no schema file)
            CampaignDraft.model_validate(d["campaign"])
            Case.model_validate(d["campaign"]["base"])
            continue
        assert d["$schema"] == "../schemas/case.schema.json", p
        Case.model_validate(d)


def test_a_prefix_ratio_without_a_cache_target_is_frozen_with_a_warning_naming_the_fix(ws: Workspace) -> None:
    prefix = {"source": "prefix_cache", "input_tokens": 512, "prefix_ratio": 0.75, "block_size": 16}
    warned = freeze_case(ws, draft=ref_draft(18001, dataset=prefix))
    assert warned.created  # a warning, not a refusal
    (w,) = warned.warnings
    assert "dataset.prefix_ratio is 0.75 but cache.min_hit_ratio is null" in w and "cold slot" in w
    assert '"cache": {"min_hit_ratio": 0.75}' in w
    assert f"WARNING: {w}" in warned.text()
    targeted = freeze_case(ws, draft=ref_draft(18001, dataset=prefix, cache={"min_hit_ratio": 0.75}))
    plain = freeze_case(ws, draft=ref_draft(18001))
    assert targeted.warnings == [] and plain.warnings == [] and "WARNING" not in plain.text()


def test_freeze_fills_defaults_and_is_idempotent(ws: Workspace) -> None:
    p = write_draft(ws, "a.json", ref_draft(18001))
    a = freeze_case(ws, str(p))
    assert a.created and a.case_id.startswith("c-")
    stored = orjson.loads(Path(a.path).read_bytes())
    assert stored["dataset"]["entries"] == 8  # filled from load.requests, visible after freezing
    assert stored["load"]["max_tokens"] == 8
    assert stored["load"]["arrival"] == "poisson"
    assert not os.access(a.path, os.W_OK) or os.geteuid() == 0
    assert oct(Path(a.path).stat().st_mode & 0o777) == "0o444"
    before = sorted(x.name for x in ws.frozen_dir.iterdir())
    mtime = Path(a.path).stat().st_mtime_ns
    b = freeze_case(ws, str(p))
    assert b.case_id == a.case_id and not b.created
    assert sorted(x.name for x in ws.frozen_dir.iterdir()) == before
    assert Path(a.path).stat().st_mtime_ns == mtime
    assert a.plan[0].phase == "preflight" and a.delta == []


def test_concurrency_only_child_is_the_hot_path(ws: Workspace) -> None:
    base = freeze_case(ws, str(write_draft(ws, "a.json", ref_draft(18001))))
    child = freeze_case(ws, draft=ref_draft(18001, load={"requests": 8, "concurrency": 4}), parent=base.case_id)
    assert [(d.path, d.old, d.new, d.impact) for d in child.delta] == [("load.concurrency", 2, 4, Impact.LOAD)]
    plan = {s.phase: s.action for s in child.plan}
    assert plan["service"] == plan["warmup"] == plan["route_verify"] == "reuse"
    assert plan["load"] == "run"


def test_requests_change_keeps_the_hot_path(ws: Workspace) -> None:
    base = freeze_case(ws, draft=ref_draft(18001))
    child = freeze_case(ws, draft=ref_draft(18001, load={"requests": 16, "concurrency": 2}), parent=base.case_id)
    assert {d.path: d.impact for d in child.delta} == {"load.requests": Impact.LOAD, "dataset.entries": Impact.LOAD}
    assert {s.phase: s.action for s in child.plan}["service"] == "reuse"


def test_max_event_bytes_at_its_default_keeps_the_case_id_and_a_change_is_the_hot_path(ws: Workspace) -> None:
    base = freeze_case(ws, draft=ref_draft(18001))
    assert "max_event_bytes" not in orjson.loads(Path(base.path).read_bytes())["load"]  # ids frozen before it hold
    assert (
        freeze_case(ws, draft=ref_draft(18001, load={"max_event_bytes": DEFAULT_MAX_EVENT_BYTES})).case_id
        == base.case_id
    )
    child = freeze_case(ws, draft=ref_draft(18001, load={"max_event_bytes": 2**26}), parent=base.case_id)
    assert child.case_id != base.case_id
    assert [(d.path, d.new, d.impact) for d in child.delta] == [("load.max_event_bytes", 2**26, Impact.LOAD)]
    assert {s.phase: s.action for s in child.plan}["service"] == "reuse"


def test_service_argv_change_runs_everything(ws: Workspace) -> None:
    d = ref_draft(18001, service={"adapter": "command", "argv": ["srv", "--port", "{port}"]})
    base = freeze_case(ws, draft=d)
    d2 = ref_draft(18001, service={"adapter": "command", "argv": ["srv", "--port", "{port}", "--fast"]})
    child = freeze_case(ws, draft=d2, parent=base.case_id)
    plan = {s.phase: s.action for s in child.plan}
    assert plan["service"] == plan["warmup"] == plan["route_verify"] == "run"
    assert child.delta[0].path == "service.argv" and child.delta[0].impact == Impact.SERVICE


def test_measurement_only_child_needs_no_new_load(ws: Workspace) -> None:
    base = freeze_case(ws, draft=ref_draft(18001))
    child = freeze_case(ws, draft=ref_draft(18001, measurement={"native": {"rule": "sglang"}}), parent=base.case_id)
    plan = {s.phase: s.action for s in child.plan}
    assert plan["load"] == "reuse" and plan["postprocess"] == "run"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["load"].update(concurrency=-1), "load.concurrency"),
        (lambda d: d.update(bogus=1), "bogus"),
        (lambda d: d["load"].pop("requests"), "load.requests"),
        (lambda d: d["target"].update(endpoints=[]), "target.endpoints"),
        (lambda d: d["dataset"].update(source="file"), "dataset.path"),
        (lambda d: d["service"].update(adapter="vlm"), "service.adapter"),
    ],
)
def test_bad_drafts_name_the_field_and_write_nothing(ws: Workspace, mutate: Any, field: str) -> None:
    d = ref_draft(18001)
    mutate(d)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=d)
    assert field in str(e.value) and "fix" not in e.value.message.lower()[:0]
    assert e.value.fix
    assert not ws.ledger.exists() or not any(ws.ledger.rglob("*.json")) or not ws.frozen_dir.exists()


def test_unknown_parent_and_bad_ids(ws: Workspace) -> None:
    with pytest.raises(NotFound) as e:
        freeze_case(ws, draft=ref_draft(18001), parent="c-000000000000")
    assert "freeze" in e.value.fix
    with pytest.raises(CaseInvalid):
        freeze_case(ws, draft=ref_draft(18001), parent="../../etc")
    with pytest.raises(PathEscapes):
        ws.run("r-../x")
    assert not ws.frozen_dir.exists()


def test_dataset_file_outside_workspace_is_refused(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "prompts.jsonl"
    outside.write_text('{"prompt": "hi"}\n' * 8)
    d = ref_draft(18001, dataset={"source": "file", "path": "../prompts.jsonl"})
    with pytest.raises(PathEscapes) as e:
        freeze_case(ws, draft=d)
    assert "dataset.path" in str(e.value)
    assert not ws.frozen_dir.exists()


def test_malformed_json_file(ws: Workspace) -> None:
    p = ws.cases_dir / "bad.json"
    p.write_text("{not json")
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, str(p))
    assert "not valid JSON" in str(e.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(
        [
            "load.concurrency",
            "load.requests",
            "load.rate",
            "dataset.input_tokens",
            "target.endpoints",
            "scenario",
            "service.adapter",
            "extra",
            "load.arrival",
        ]
    ),
    value=json_values,
)
def test_random_drafts_either_freeze_or_fail_cleanly(ws: Workspace, path: str, value: Any) -> None:
    d = ref_draft(18001)
    node = d
    *head, last = path.split(".")
    for k in head:
        node = node[k]
    node[last] = value
    before = set(ws.frozen_dir.iterdir()) if ws.frozen_dir.exists() else set()
    try:
        r = freeze_case(ws, draft=d)
    except CaseInvalid as e:
        assert e.fix and ("." in e.message or "case" in e.message)
        after = set(ws.frozen_dir.iterdir()) if ws.frozen_dir.exists() else set()
        assert after == before
    else:
        assert Path(r.path).exists()


# ---- the input boundary: non-finite numbers, booleans for integers, out-of-range numbers and strings ------------


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    node: Any = d
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[last] = value


def test_every_number_has_an_upper_bound_and_is_strict() -> None:
    def walk(model: type[BaseModel], prefix: str = "") -> None:
        for name, f in model.model_fields.items():
            args = typing.get_args(f.annotation) or (f.annotation,)
            sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if sub is not None:
                walk(sub, f"{prefix}{name}.")
            elif {int, float, bool} & set(args):
                kinds = {type(m) for m in f.metadata}
                assert any(getattr(m, "strict", False) for m in f.metadata), f"{prefix}{name} is not strict"
                if bool not in args:
                    assert kinds & {annotated_types.Le, annotated_types.Lt}, f"{prefix}{name} has no upper bound"

    walk(Case)


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("load.timeout_s", float("inf"), "finite"),
        ("load.rate", float("nan"), "finite"),
        ("service.reference.decode_step_s", float("-inf"), "finite"),
        ("load.concurrency", True, "not a boolean"),
        ("warmup.requests", False, "not a boolean"),
        ("load.ignore_eos", 1, "boolean"),
        ("load.requests", 10**30, "less than or equal to 1000000"),
        ("dataset.seed", 2**64, "less than or equal to 9223372036854775807"),
        ("load.requests", 1e12, "without a decimal point"),
        ("load.requests", 10**12, "less than or equal to 1000000"),
        ("load.concurrency", 100_001, "less than or equal to 100000"),
        ("dataset.input_tokens", 10**12, "less than or equal to 2097152"),
        ("dataset.output_tokens", 2_097_153, "less than or equal to 2097152"),
        ("scenario", "s" * 10_000_000, "at most 200 characters"),
        ("target.endpoints.0.model", "m" * 10_000_000, "at most 500 characters"),
        ("target.endpoints.0.base_url", "http://127.0.0.1:1/" + "v" * 3000, "at most 2048 characters"),
    ],
)
def test_non_finite_boolean_and_out_of_range_values_are_refused_naming_the_field(
    ws: Workspace, path: str, value: Any, says: str
) -> None:
    d = ref_draft(18001)
    _set(d, path, value)
    before = tree_digest(ws.root)
    t0 = time.monotonic()
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=d)
    assert time.monotonic() - t0 < 5  # refused at validation: no hang, no MemoryError
    assert f"{path}:" in e.value.message and says in e.value.message, e.value.message
    assert e.value.fix and "nothing was written" in e.value.fix
    assert len(e.value.message) < 600  # a 10 MB value is not echoed
    assert tree_digest(ws.root) == before  # ledger/ included: no case, dataset, lock or temp file


def test_dataset_too_large_to_materialize_is_refused_naming_both_fields(ws: Workspace) -> None:
    d = ref_draft(18001, load={"requests": 1_000_000, "concurrency": 64}, dataset={"input_tokens": 131072})
    before = tree_digest(ws.root)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=d)
    assert "dataset.input_tokens" in e.value.message and "load.requests" in e.value.message
    assert tree_digest(ws.root) == before  # ledger/ included: no case, dataset, lock or temp file
    # the seeds' largest campaign (N 640, 131072 input tokens) stays well inside every bound
    Case.model_validate(
        ref_draft(
            18001, load={"requests": 640, "concurrency": 64}, dataset={"input_tokens": 131072, "output_tokens": 1024}
        )
    )


def _big_campaign(ws: Workspace) -> dict[str, Any]:
    """Three datasets of N 2048 (131072, 98304 and 65536 input tokens): each under the bound, together over it."""
    base = ref_draft(18001, load={"requests": 2048, "concurrency": 64}, dataset={"input_tokens": 65536})
    axes = [{"path": "dataset.input_tokens", "values": [131072, 98304, 65536]}]
    body = {"name": "big", "base": base, "axes": axes, "decision": {"primary_metric": "output_throughput"}}
    return {"campaign": body}


def _big_trace(ws: Workspace) -> dict[str, Any]:
    """A 30 KB trace whose 300 rows ask 2,000,000 input tokens each: counted by its rows, not by N x a length."""
    rows = [{"timestamp": k, "input_length": 2_000_000, "output_length": 8, "hash_ids": []} for k in range(300)]
    (ws.root / "big.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return ref_draft(18001, load={"requests": 300}, dataset={"source": "trace", "path": "big.jsonl"})


# each one over the bound (2**29 input tokens per freeze) by a way the former check (2**30 per case, traces not
# counted) let through: generating it took 8 to 15 CPU-minutes
OVER_THE_BOUND = {
    "one case": (
        lambda ws: ref_draft(18001, load={"requests": 8192, "concurrency": 64}, dataset={"input_tokens": 131072}),
        ["load.requests 8192 x dataset.input_tokens 131072 = 1,073,741,824"],
    ),
    "every turn of its sessions": (
        lambda ws: ref_draft(
            18001,
            load={"requests": 10_000, "concurrency": 64},
            dataset={"input_tokens": 65536, "sessions": {"count": 100, "turns": 100}},
        ),
        ["load.requests 10000 (every turn of dataset.sessions) x dataset.input_tokens 65536"],
    ),
    "the longest drawn length": (
        lambda ws: ref_draft(
            18001,
            load={"requests": 8192, "concurrency": 64},
            dataset={"input_tokens": {"distribution": "uniform", "min": 1024, "max": 131072}},
        ),
        ["dataset.input_tokens max 131072"],
    ),
    "a trace's rows": (_big_trace, ["input_length of dataset.path 'big.jsonl' over 300 rows = 600,000,000"]),
    "a campaign's datasets together": (
        _big_campaign,
        ["over 3 dataset(s)", "point 'input_tokens=131072': load.requests 2048 x dataset.input_tokens 131072"],
    ),
}


@pytest.mark.parametrize("shape", sorted(OVER_THE_BOUND))
def test_a_freeze_that_would_generate_too_many_tokens_is_refused_at_once_naming_the_fields(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    import caseledger.datasets.generate as generate

    def generated(*args: object, **kw: object) -> None:
        raise AssertionError("a dataset was generated: the bound is checked after generation starts, or not at all")

    monkeypatch.setattr(generate, "generate_dataset", generated)
    draft, said = OVER_THE_BOUND[shape]
    d = draft(ws)
    before = tree_digest(ws.root)
    t0 = time.monotonic()
    with pytest.raises(CaseInvalid) as e:
        freeze_any(ws, draft=d)
    assert time.monotonic() - t0 < 5
    assert "above the 536,870,912 one freeze may generate (case/bounds.py MAX_FREEZE_TOKENS)" in e.value.message
    assert all(s in e.value.message for s in said), e.value.message
    fix = "a trace: fewer of its rows (load.requests)" if shape == "a trace's rows" else "lower load.requests"
    assert e.value.fix.startswith(fix), e.value.fix
    assert e.value.fix.endswith("; nothing was written")
    assert tree_digest(ws.root) == before  # ledger/ included: no case, campaign, dataset, lock or temp file


def test_large_realistic_freezes_are_inside_the_bound_and_a_dataset_already_generated_is_not_counted(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from caseledger.case.bounds import MAX_FREEZE_TOKENS
    from caseledger.case.store import validate
    from caseledger.datasets import check_generation
    from caseledger.datasets import store as dataset_store

    def case(requests: int, tokens: int, **ds: Any) -> Case:
        d = ref_draft(18001, load={"requests": requests, "concurrency": 64}, dataset={"input_tokens": tokens, **ds})
        return validate(d, "draft")

    # the seeds' largest case (N 640 x 131072 input tokens), six times over in one campaign, and 64 conversations of
    # 16 turns of 16384 tokens each: checked without generating anything
    seeds = [(f"point 'seed={k}'", case(640, 131072, seed=k)) for k in range(6)]
    check_generation(ws, seeds, "campaign")
    check_generation(ws, [("", case(1024, 16384, sessions={"count": 64, "turns": 16}))], "draft")
    assert MAX_FREEZE_TOKENS >= 6 * 640 * 131072
    # a dataset an earlier freeze generated is reused: a campaign frozen in parts counts only what it generates
    monkeypatch.setattr(dataset_store, "MAX_FREEZE_TOKENS", 8 * 64 + 8 * 48)
    small = [("", case(8, 64)), ("", case(8, 48)), ("", case(8, 40))]
    with pytest.raises(CaseInvalid, match="would generate 1,216 input tokens at freeze over 3 dataset"):
        check_generation(ws, small, "campaign")
    freeze_case(ws, draft=ref_draft(18001, dataset={"input_tokens": 64}))
    check_generation(ws, small, "campaign")  # 8 x 48 + 8 x 40: the first is on disk


@pytest.mark.parametrize(
    ("raw", "path", "says"),
    [
        (b'"timeout_s": Infinity', "load.timeout_s", "Infinity is not a JSON number"),
        (b'"timeout_s": -Infinity', "load.timeout_s", "-Infinity is not a JSON number"),
        (b'"timeout_s": NaN', "load.timeout_s", "NaN is not a JSON number"),
        (b'"timeout_s": 1e400', "load.timeout_s", "1e400 is not a finite number"),
        (b'"requests": 100000000000000000000000000', "load.requests", "beyond 64 bits"),
        (b'"requests": -9223372036854775809', "load.requests", "beyond 64 bits"),
        (b'"requests": 1e12', "load.requests", "without a decimal point"),
        (b'"requests": true', "load.requests", "not a boolean"),
    ],
)
def test_raw_json_literals_no_case_can_hold_are_refused_naming_the_field(
    ws: Workspace, raw: bytes, path: str, says: str
) -> None:
    text = orjson.dumps(ref_draft(18001)).replace(b'"requests":8', b'"requests":8,' + raw, 1)
    if b'"requests": ' in raw:  # the bad literal replaces load.requests itself
        text = orjson.dumps(ref_draft(18001)).replace(b'"requests":8,"concurrency"', raw + b',"concurrency"', 1)
    assert raw in text
    p = ws.cases_dir / "bad.json"
    p.write_bytes(text)
    before = tree_digest(ws.root)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, str(p))
    assert f"{path}:" in e.value.message and says in e.value.message, e.value.message
    assert e.value.fix and ("nothing was written" in e.value.fix)
    assert tree_digest(ws.root) == before  # ledger/ included: no case, dataset, lock or temp file
