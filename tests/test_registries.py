"""One registry per concept, read everywhere else: the engine profiles (caseledger/engines, one module each) and
the metrics table (caseledger/case/metrics.py). Every choice derived from them agrees with them, a new entry is
picked up without another edit, and docs/architecture.md's worked examples name the files they imply."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import get_args

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from caseledger import engines, init
from caseledger.case import metrics as table_module
from caseledger.case.measurement import Measurement
from caseledger.case.metrics import LIMITS, METRICS, SAMPLES, TABLE, Figure, Metric, Stat
from caseledger.case.model import Limits
from caseledger.case.schema import case_schema
from caseledger.cli import main
from caseledger.metrics import Interval, NotObserved
from caseledger.metrics._noise import interval, pooled
from tests.architecture import DOC, EXAMPLES, ROOT

# per-request samples spread out, each on its own scale; every request takes the same time end to end, so a rate
# resampled over them moves only with what each request carries (a request-count rate not at all)
N = 400
SPREAD = np.linspace(1.0, 1000.0, N)
SAMPLE_VALUES = {
    "ttft": SPREAD,
    "tpot": SPREAD * 0.01 + 5.0,
    "e2e": np.full(N, 2000.0),
    "output": np.round(SPREAD / 10.0) + 1.0,
    "good": (np.arange(N) % 3 != 0).astype(np.float64),
}


# --- the metrics table ---


def test_every_metric_in_the_table_has_each_property() -> None:
    names = [m.name for m in TABLE]
    assert len(names) == len(set(names)), "a metric is in the table twice"
    for m in TABLE:
        assert m.figure in get_args(Figure) and m.stat in get_args(Stat), m.name
        assert m.unit and m.label, m.name
        assert m.kind in ("rate", "percentile"), m.name
        assert m.primary or m.limit, f"{m.name}: neither compared nor bounded, so never read"
        assert m.sample is None or m.sample in SAMPLES, m.name
        assert not m.primary or m.sample is not None, f"{m.name}: a decision metric needs an interval's sample"
        if m.kind == "percentile":
            assert m.name == f"{m.figure}_{m.stat}" and m.unit == "ms" and not m.higher_is_better, m.name
            assert m.quantile == float(m.stat[1:]), m.name
        else:
            assert not m.limit and m.higher_is_better, m.name
    assert list(METRICS) == [m.name for m in TABLE if m.primary]
    assert list(LIMITS) == [f"{m.name}_ms" for m in TABLE if m.limit]
    assert all(lim.name == key for key, lim in LIMITS.items())  # a limit's entry carries its own name


def test_the_schema_and_the_limits_are_the_tables() -> None:
    schema = orjson.loads(case_schema())["$defs"]
    assert schema["Decision"]["properties"]["primary_metric"]["enum"] == list(METRICS)
    assert schema["Decision"]["properties"]["tie_break"]["enum"] == list(LIMITS)
    limits = schema["Limits"]["properties"]  # the schema's keys are sorted; the model's fields in table order
    assert list(Limits.model_fields) == list(LIMITS) and set(limits) == set(LIMITS)
    for name, m in LIMITS.items():
        assert f"Upper bound on {m.label} of the decision window" in limits[name]["description"], name


@pytest.mark.parametrize("m", [m for m in TABLE if m.sample is not None], ids=lambda m: m.name)
def test_every_metric_with_a_sample_has_an_interval_of_its_own_kind(m: Metric) -> None:
    """A percentile resamples its own sample's values (its undefined ones dropped), a rate every request by what
    it carries: a percentile taken for a rate would count every request, or refuse the undefined ones."""
    samples = dict(SAMPLE_VALUES)
    if m.kind == "percentile":
        own = samples[m.sample or ""].copy()
        own[:10] = np.nan  # e.g. TPOT of a one-token output
        samples[m.sample or ""] = own
        point, requests = float(np.nanpercentile(own, m.quantile)), N - 10
    else:
        point, requests = 100.0, N
    iv = interval(m.name, point, samples)
    assert isinstance(iv, Interval), (m.name, iv)
    assert iv.low <= point <= iv.high and iv.metric == m.name and iv.requests == requests
    if m.sample == "request":  # each request counts one and takes the same time: every resample is the point
        assert iv.low == iv.high == point
    elif m.kind == "rate" or m.sample != "e2e":
        assert iv.high > iv.low, f"{m.name}: a zero-width interval, resampled as something else"


def test_a_percentile_added_to_the_table_is_resampled_as_a_percentile(monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry is all a new percentile needs: its interval resamples TPOT at p90, not a rate."""
    p90 = Metric("tpot_p90", "tpot", "p90", "ms", "TPOT p90", "tpot")
    monkeypatch.setattr("caseledger.metrics._noise.TABLE", (*TABLE, p90), raising=False)
    point = float(np.percentile(SAMPLE_VALUES["tpot"], 90.0))
    iv = interval("tpot_p90", point, SAMPLE_VALUES)
    assert isinstance(iv, Interval) and iv.low < point < iv.high, iv  # a rate's here: zero width
    pooled_iv = pooled("tpot_p90", [SAMPLE_VALUES, SAMPLE_VALUES])
    assert isinstance(pooled_iv, Interval) and pooled_iv.point == pytest.approx(point)


def test_a_metric_outside_the_table_has_no_interval() -> None:
    """Never a silent default: a name the table lacks is refused, naming the table."""
    with pytest.raises(ValueError, match=r"tpot_p95.*caseledger\.case\.metrics\.TABLE"):
        interval("tpot_p95", 10.0, SAMPLE_VALUES)
    itl = interval("itl_p99", 10.0, SAMPLE_VALUES)  # in the table, without a per-request sample
    assert isinstance(itl, NotObserved) and "no per-request sample" in itl.reason


# --- the engine profiles ---


def test_every_engine_module_is_a_profile_and_every_choice_follows_from_them() -> None:
    modules = sorted(p.stem for p in Path(engines.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert sorted(engines.PROFILES) == sorted(set(modules) - set(engines.NOT_MODULES))
    for name, p in engines.PROFILES.items():
        assert sys.modules[f"caseledger.engines.{name}"].PROFILE is p
    templated = [n for n in engines.PROFILES if (engines.TEMPLATES / f"{n}.json").is_file()]
    assert templated, "no engine has a template"
    assert (*templated, *init.NOT_ENGINES) == init.ENGINES
    shipped = sorted(p.stem for p in engines.TEMPLATES.glob("*.json"))
    assert shipped == sorted(init.ENGINES), "a template without an engine profile, or the reverse"
    counting = [n for n, p in engines.PROFILES.items() if p.names("spec_drafts")]
    assert ("auto", *counting, "none") == engines.SPEC_DECODE
    spec = orjson.loads(case_schema())["$defs"]["Measurement"]["properties"]["spec_decode"]
    assert spec["enum"] == list(engines.SPEC_DECODE)
    for value in engines.SPEC_DECODE:
        assert Measurement.model_validate({"spec_decode": value}).spec_decode == value
    quiet = next(n for n, p in engines.PROFILES.items() if not p.names("spec_drafts"))
    with pytest.raises(ValidationError, match="spec_decode"):
        Measurement.model_validate({"spec_decode": quiet})


def test_the_init_help_names_every_engine_with_a_template(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["init", "--help"])
    named = re.findall(r"[a-z]+", capsys.readouterr().out.split("--engine ENGINE", 1)[1])
    for name in init.ENGINES:
        assert name in named, f"caseledger init --help omits {name}"


def _engine_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modules: dict[str, str]) -> Path:
    """A package of engine modules of its own (a fresh name: nothing imported before stands in for it)."""
    pkg = tmp_path / f"more_engines_{uuid.uuid4().hex}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, body in modules.items():
        (pkg / f"{name}.py").write_text(f"from caseledger.engines.profile import EngineProfile\n{body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return pkg


def test_a_new_engine_is_its_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _engine_package(
        tmp_path,
        monkeypatch,
        {
            "newserve": 'PROFILE = EngineProfile(name="newserve", rank=2, what="x", metrics={"spec_drafts": "n_d"})',
            "older": 'PROFILE = EngineProfile(name="older", rank=1, what="y")',
            "profile": "",  # the dataclass's module, never an engine
        },
    )
    found = engines.discover(pkg.name, [str(pkg)])
    assert list(found) == ["older", "newserve"]  # by rank
    assert found["newserve"].names("spec_drafts") == ("n_d",)


@pytest.mark.parametrize(
    ("body", "fix"),
    [
        ("PROFILE = None", r"define it there, or name the module in engines\.NOT_MODULES"),
        ('PROFILE = EngineProfile(name="other", rank=3, what="x")', r"no PROFILE = EngineProfile\(name='wrong'"),
        ('PROFILE = EngineProfile(name="wrong", rank=1, what="x")', r"share a rank.*give each its own"),
    ],
)
def test_an_engine_module_that_is_not_a_profile_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, fix: str
) -> None:
    pkg = _engine_package(
        tmp_path, monkeypatch, {"wrong": body, "first": 'PROFILE = EngineProfile(name="first", rank=1, what="y")'}
    )
    with pytest.raises(ValueError, match=fix):
        engines.discover(pkg.name, [str(pkg)])


# --- the worked examples ---


def _section() -> str:
    doc = DOC.read_text()
    start = doc.index(EXAMPLES)
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end != -1 else len(doc)]


def test_the_worked_examples_name_the_files_the_registries_imply() -> None:
    named = {p for p in re.findall(r"`([^`]+)`", _section()) if "/" in p and "<" not in p}
    engines_dir = Path(engines.__file__).parent
    implied = {
        (engines_dir / "__init__.py"),
        Path(table_module.__file__),
        ROOT / "tests" / "test_metric_registry.py",
        Path(sys.modules[TABLE[0].__module__].__file__ or ""),
    }  # a percentile: its entry and its test, nothing else (the end-to-end test below adds one)
    for name in engines.PROFILES:
        implied.add(engines_dir / f"{name}.py")
        if name in init.ENGINES:
            implied.add(engines.TEMPLATES / f"{name}.json")
    assert named == {p.resolve().relative_to(ROOT).as_posix() for p in implied}
    assert all((ROOT / p).is_file() for p in named), named
    assert interval.__globals__["TABLE"] is TABLE, "the intervals read another table than the one named"


# --- a new percentile, end to end ---


@contextlib.contextmanager
def _table_with(entry: str) -> Iterator[ModuleType]:
    """caseledger imported afresh, its metrics table with one more line (`entry`, after TTFT p50): whatever reads
    the table sees the entry as if it had always been there. The modules imported before are restored after."""
    src = Path(table_module.__file__).read_text()
    anchor = '    _pct("ttft", "p50", "TTFT"),\n'
    assert anchor in src, "the table's TTFT p50 line moved: give the test another anchor"

    def ours() -> list[str]:
        return [n for n in sys.modules if n == "caseledger" or n.startswith("caseledger.")]

    saved = {n: sys.modules.pop(n) for n in ours()}
    try:
        importlib.import_module("caseledger.case")
        spec = importlib.util.spec_from_loader(table_module.__name__, loader=None)
        assert spec is not None
        fresh = importlib.util.module_from_spec(spec)
        fresh.__file__ = table_module.__file__
        sys.modules[table_module.__name__] = fresh
        exec(compile(src.replace(anchor, anchor + entry), table_module.__file__, "exec"), fresh.__dict__)
        yield fresh
    finally:
        for n in ours():
            del sys.modules[n]
        sys.modules.update(saved)


def test_a_percentile_added_to_the_table_reaches_every_view_without_another_edit() -> None:
    """A TTFT percentile the table lacks (p75 today), one line in TABLE: a decision may compare and bound it, the
    scenario row has its column (after TTFT p50) and the scenario table prints it; the case schema changes with it
    (its files are then regenerated)."""
    stat = next(s for s in get_args(Stat) if re.fullmatch(r"p\d+", s) and f"ttft_{s}" not in {m.name for m in TABLE})
    name = f"ttft_{stat}"
    with _table_with(f'    _pct("ttft", "{stat}", "TTFT"),\n') as table:
        assert list(table.LIMITS)[:2] == ["ttft_p50_ms", f"{name}_ms"] and name in table.METRICS
        model = importlib.import_module("caseledger.case.model")
        decision = model.Decision.model_validate({"primary_metric": name, "limits": {f"{name}_ms": 300}})
        assert decision.limits.bounds() == {f"{name}_ms": 300}
        assert f'"{name}_ms"'.encode() in importlib.import_module("caseledger.case.schema").case_schema()
        scenario = importlib.import_module("caseledger.views.scenario")
        fields = list(scenario.ScenarioRow.model_fields)
        assert fields[fields.index("metric") + 1 :][: len(table.LIMITS)] == list(table.LIMITS)
        row = scenario.ScenarioRow.model_validate(
            {
                **dict.fromkeys(("swept", "run_id", "metric", "decision", "settle"), None),
                **{lim: float(i) for i, lim in enumerate(table.LIMITS, 1)},
                f"{name}_ms": 123.0,
                **{"case_id": "c-1", "change": "baseline", "runs": 1, "state": "succeeded", "limits": []},
                "best": False,
            }
        )
        view = scenario.ScenarioView.model_validate(
            {
                **dict.fromkeys(("baseline_case", "swept", "best_case"), None),
                **{"scenario": "s", "primary_metric": name, "window": "whole", "direction": "lower_is_better"},
                **{"limits": [], "rows": [row], "decisions": "-"},
            }
        )
        header, line = view.text().splitlines()[1:3]
        assert stat in header.split(" | ")[1].removesuffix(" ms").split()[-1].split("/"), header
        assert "123" in line.split(" | ")[1].split()[0].split("/"), line  # in the TTFT column
    assert f"{name}_ms" not in importlib.import_module("caseledger.views.scenario").ScenarioRow.model_fields
