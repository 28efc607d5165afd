"""Importing a peer tool's output as a run in the ledger: an imported case, raw records, no phases to run.

The imported run has an (imported) frozen case so that every reader works on it; the phases that did not
happen here are recorded as skipped with the reason, and postprocess + decide run on the raw data
exactly as `reprocess_raw` does. Re-windowing, reports and comparisons then work as for any run.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from caseledger import ledger
from caseledger.case.model import Case
from caseledger.case.phases import PHASES, Phase
from caseledger.case.plan import PlanStep
from caseledger.case.store import store, validate
from caseledger.errors import CaseInvalid, NotFound
from caseledger.importers.aisbench import AisbenchImport, AisbenchImportError, read_aisbench
from caseledger.ledger import event_types as et
from caseledger.ledger.runs import Imported, RunMeta, new_run_id, write_meta
from caseledger.records import RawRecord
from caseledger.tools import reprocess_raw
from caseledger.workspace import RunPaths, Workspace, atomic_write, canonical_json, utc_now, write_json


def _peak_concurrency(records: list[RawRecord]) -> int:
    events = sorted(
        [(r["send_ns"], 1) for r in records] + [(r["end_ns"], -1) for r in records], key=lambda x: (x[0], x[1])
    )
    c = peak = 0
    for _, d in events:
        c += d
        peak = max(peak, c)
    return max(1, peak)


def import_run(ws: Workspace, kind: str, path: str | Path, scenario: str | None = None) -> str:
    """Create a run from a peer tool's output directory; returns the run id."""
    if kind != "aisbench":
        raise CaseInvalid(f"unknown import kind '{kind}'; known: aisbench", "caseledger import aisbench DIR")
    src = Path(path).resolve()
    imp = _read(src, path)
    recs = sorted(imp.records, key=lambda r: r["send_ns"])
    if not recs:
        raise CaseInvalid(f"no request records in {imp.details_file}", "check the AISBench run finished")
    case = validate(_draft(imp, src, scenario, recs), "imported case")
    cid, _ = store(ws, case)
    rid = new_run_id(ws)
    paths = ws.run(rid)
    paths.root.mkdir(parents=True)
    atomic_write(paths.case, canonical_json(case.canonical()) + b"\n", mode=0o444)
    skip = PHASES[: PHASES.index(Phase.POSTPROCESS)]
    write_meta(paths, _meta(ws, rid, cid, case, imp, src, len(recs), skip))
    _write_load(paths, recs)
    ledger.append_event(
        ws, paths, et.RunCreated(data=et.RunCreatedData(case_id=cid, imported_from=str(src))), owner="import"
    )
    for p in skip:
        ledger.append_event(
            ws,
            paths,
            et.PhaseEnded(
                phase=p,
                attempt=1,
                data=et.PhaseEndedData.model_validate(
                    {"outcome": "skipped", "reason": "imported: not executed by caseledger"}
                ),
            ),
            owner="import",
        )
    reprocess_raw(ws, rid)
    return rid


def _read(src: Path, path: str | Path) -> AisbenchImport:
    if not src.is_dir():
        raise NotFound(f"'{path}' is not a directory", "give AISBench's performances/<model>/ directory")
    try:
        return read_aisbench(src)
    except AisbenchImportError as e:
        raise CaseInvalid(
            f"'{path}' is not a readable AISBench perf output: {e}",
            "point at the folder holding *_details.jsonl and db_data/",
        ) from None


def _draft(
    imp: AisbenchImport,
    src: Path,
    scenario: str | None,
    recs: list[RawRecord],
) -> dict[str, Any]:  # JSON: a case draft
    """The imported case's draft (a JSON document, validated like any draft): N and C as the records show."""
    outs = [int(r["completion_tokens"] or 0) for r in recs if r.get("completion_tokens")]
    return {
        "scenario": scenario or f"aisbench-{imp.dataset}".replace("/", "-")[:60],
        "note": f"imported from AISBench perf output {src} ({imp.details_file.name}); not executed by caseledger",
        "target": {"endpoints": [{"base_url": "http://imported.invalid/v1", "model": "imported"}]},
        "service": {"adapter": "external"},
        "dataset": {"source": "synthetic", "output_tokens": max(outs) if outs else 1},
        "load": {"requests": len(recs), "concurrency": _peak_concurrency(recs), "salt": False},
    }


def _meta(
    ws: Workspace, rid: str, cid: str, case: Case, imp: AisbenchImport, src: Path, n: int, skip: tuple[Phase, ...]
) -> RunMeta:
    return RunMeta(
        run_id=rid,
        case_id=cid,
        scenario=case.scenario,
        workspace=str(ws.root),
        planned=n,
        target_key=ledger.target_key(case.canonical()),
        created_utc=utc_now(),
        load_reused=True,
        plan=[
            PlanStep(
                phase=p, action="skip" if p in skip else "run", reason="imported" if p in skip else "from raw data"
            )
            for p in PHASES
        ],
        imported=Imported(
            tool="aisbench",
            path=str(src),
            dataset=imp.dataset,
            skipped=list(imp.skipped[:20]),
            differences=list(imp.differences),
            aisbench_summary=orjson.loads(orjson.dumps(imp.summary, default=_plain)),
        ),
    )


def _write_load(paths: RunPaths, recs: list[RawRecord]) -> None:
    """The raw records and the end file, as a load client of ours would have left them."""
    paths.load_dir.mkdir(parents=True)
    atomic_write(paths.raw, b"".join(orjson.dumps(r) + b"\n" for r in recs))
    n = len(recs)
    ok = sum(1 for r in recs if r["ok"])
    write_json(
        paths.load_end,
        {
            "planned": n,
            "sent": n,
            "done": n,
            "ok": ok,
            "failed": n - ok,
            "first_send_ns": recs[0]["send_ns"],
            "last_end_ns": max(r["end_ns"] for r in recs),
            "exit": "imported",
        },
    )


def _plain(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError
