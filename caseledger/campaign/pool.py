"""A campaign's pool of targets: what each target's runs showed of it, and the targets refused as not equivalent.

The pool is declared equivalent (campaign.pool: same hardware and model, different endpoints). The declaration is
checked against evidence: each target's measured identity is read from its first run whose service phase recorded
one (the engine's version, the hashes of its model and declared files, the models its endpoints answer, the argv
read back from the live process with the target's own address taken out). The first target measured sets the
identity; a target whose identity differs is refused with the difference: its runs count for no point and the
driver starts none there. Derived from the ledger at every look (writes nothing), like every campaign view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from caseledger.campaign.store import Campaign
from caseledger.case.phases import Phase
from caseledger.case.store import load_case
from caseledger.errors import EvidenceInvalid
from caseledger.ledger.evidence import ServiceRecord, read_evidence
from caseledger.ledger.runs import RunMeta
from caseledger.workspace import Workspace

Identity = dict[str, str]  # what a target's service showed, by name: 'engine_version', 'model_file --model', ...


@dataclass(frozen=True)
class PoolCheck:
    targets: list[str]  # the pool's names, as declared
    identity: dict[str, Identity]  # target -> its measured identity (targets measured so far)
    refused: dict[str, str]  # target -> why it is not equivalent (the difference)
    runs: dict[str, int]  # target -> runs of the campaign on it

    def lines(self) -> list[str]:
        """Per target: its runs and, when refused, why ('node-b: refused: engine_version ...')."""
        out = []
        for t in self.targets:
            state = (
                f"refused: {self.refused[t]}"
                if t in self.refused
                else ("identity measured" if t in self.identity else "identity not measured yet")
            )
            out.append(f"{t}: {self.runs.get(t, 0)} run(s), {state}")
        return out


def target_of(camp: Campaign, case_id: str) -> str:
    """The pool target a case of the campaign runs on ('' without a pool or for a case not of it)."""
    p = camp.point(case_id)
    return p.target_of(case_id) if p is not None else ""


def measured_identity(ws: Workspace, camp: Campaign, m: RunMeta) -> Identity | None:
    """The identity a run's service phase showed (None: it recorded none: not ended, failed, or reused without
    evidence). The argv is read back from the process with the target's own address (host, port and the values
    its pool entry sets) replaced by '<target>': the same engine on another port is the same service."""
    try:
        rec = read_evidence(ws.run(m.run_id), Phase.SERVICE)
    except EvidenceInvalid:
        return None
    if not isinstance(rec, ServiceRecord):
        return None
    own = _own_words(ws, camp, m.case_id)
    out: Identity = {}
    for i, p in enumerate(rec.processes):
        name = getattr(p, "name", None) or str(i)
        if p.engine_version:
            out[f"{name} engine_version"] = p.engine_version
        if p.engine:
            out[f"{name} engine"] = p.engine
        for mf in p.model_files or []:
            out[f"{name} model_file {mf.get('option', '?')}"] = str(mf.get("sha256", "?"))
        for df in p.files or []:
            out[f"{name} file {df.path.rsplit('/', 1)[-1]}"] = str(df.sha256)
        for j, e in enumerate(p.endpoints or []):
            out[f"{name} served models {j}"] = ",".join(sorted(map(str, e.get("models") or [])))
        if p.effective_argv:
            out[f"{name} argv"] = " ".join("<target>" if w in own else w for w in _split(p.effective_argv))
    return out or None


def _split(argv: list[str]) -> list[str]:
    """--opt=value read as --opt value: the address is a word of its own either way."""
    return [w for a in argv for w in (a.split("=", 1) if a.startswith("-") and "=" in a else [a])]


def _own_words(ws: Workspace, camp: Campaign, case_id: str) -> set[str]:
    """The words of an argv that say where this target is: its endpoints' hosts and ports, its pool values."""
    case = load_case(ws, case_id)
    words: set[str] = set()
    for e in case.target.endpoints:
        u = urlsplit(e.base_url)
        words |= {u.hostname or "", str(u.port or "")}
    entry = next((t for t in camp.pool if t.name == target_of(camp, case_id)), None)
    words |= {f"{v:g}" if isinstance(v, float) else str(v) for v in (entry.set.values() if entry else [])}
    return words - {""}


def check(ws: Workspace, camp: Campaign, mine: list[RunMeta]) -> PoolCheck:
    """Each target's measured identity, oldest run first, and the targets refused against the first measured."""
    names = [t.name for t in camp.pool]
    ident: dict[str, Identity] = {}
    runs: dict[str, int] = {}
    for m in mine:
        t = target_of(camp, m.case_id)
        runs[t] = runs.get(t, 0) + 1
        if t and t not in ident and (got := measured_identity(ws, camp, m)) is not None:
            ident[t] = got
    refused: dict[str, str] = {}
    first = next(iter(ident), None)
    for t, got in ident.items():
        if first is None or t == first:
            continue
        diff = [
            f"{k}: {first} {a!r}, {t} {b!r}"
            for k in sorted(set(got) | set(ident[first]))
            if got.get(k) != ident[first].get(k)
            for a, b in [where_they_differ(ident[first].get(k, "-"), got.get(k, "-"))]
        ]
        if diff:
            refused[t] = f"its measured identity differs from {first}'s: " + "; ".join(diff[:3])
    return PoolCheck(targets=names, identity=ident, refused=refused, runs=runs)


def where_they_differ(a: str, b: str, context: int = 30) -> tuple[str, str]:
    """Two long values cut to where they differ ('…"decode_step_s":0.004,…'), short ones whole."""
    if len(a) <= 2 * context and len(b) <= 2 * context:
        return a, b
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, i - context)

    def cut(v: str) -> str:
        return ("…" if lo else "") + v[lo : i + context] + ("…" if i + context < len(v) else "")

    return cut(a), cut(b)


def spread(metric: list[float], targets: list[str]) -> tuple[float | None, float | None]:
    """(within, between) at one point, relative to its mean: the largest half-range of the runs on one target,
    and the half-range of the targets' means; None where fewer than two runs (targets) give one."""
    by: dict[str, list[float]] = {}
    for v, t in zip(metric, targets, strict=True):
        by.setdefault(t, []).append(v)
    mean = sum(metric) / len(metric) if metric else 0.0
    if not mean or not math.isfinite(mean):
        return None, None
    within = [(max(v) - min(v)) / 2 / abs(mean) for v in by.values() if len(v) > 1]
    means = [sum(v) / len(v) for v in by.values()]
    between = (max(means) - min(means)) / 2 / abs(mean) if len(means) > 1 else None
    return (max(within) if within else None), between
