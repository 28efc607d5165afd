"""The case files in cases/: every one freezes, and the engine templates carry what caseledger reads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger.case.model import Case
from caseledger.services import intended_argv
from caseledger.tools import freeze_case
from caseledger.workspace import Workspace

CASES = Path(__file__).resolve().parent.parent / "cases"
ALL = sorted(p.name for p in CASES.glob("*.json"))

# engine -> (template, spec-decode counter family, what must be in the argv, what the note must name)
ENGINES: dict[str, tuple[str, str, list[str], list[str]]] = {
    "llamacpp": ("llamacpp.json", "llamacpp", ["--metrics", "--swa-full", "--host", "{host}", "--port", "{port}"],
                 ["cached_tokens", "llamacpp:spec_decode_num_drafts_total",
                  "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:prompt_tokens_total"]),
    "llamacpp-spec": ("llamacpp-spec.json", "llamacpp",
                      ["--metrics", "-md", "{draft_model}", "--spec-type", "{spec_type}", "--spec-draft-n-max",
                       "{draft_max}", "{port}"],
                      ["timings.draft_n", "timings.draft_n_accepted", "llamacpp:spec_decode_num_drafts_total",
                       "llamacpp:spec_decode_num_draft_tokens_total",
                       "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"]),
    "vllm": ("vllm.json", "vllm", ["serve", "--enable-prompt-tokens-details", "--speculative-config", "{port}"],
             ["cached_tokens", "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
              "vllm:spec_decode_num_accepted_tokens_total", "/reset_prefix_cache"]),
    "sglang": ("sglang.json", "sglang", ["sglang.launch_server", "--enable-cache-report", "--enable-metrics",
                                         "--speculative-algorithm", "{port}"],
               ["cached_tokens", "sglang:spec_verify_calls_total", "sglang:cached_tokens_total", "/flush_cache"]),
    "mindie": ("mindie.json", "none", [],
               ["cached_tokens", "MIES_CONFIG_JSON_PATH", "prefix_cache", "enablePrefixCache",
                "MIES_SERVICE_MONITOR_MODE"]),
}


def draft(name: str) -> dict[str, Any]:
    return dict(orjson.loads((CASES / name).read_bytes()))


@pytest.fixture
def tmp_ws(tmp_path: Path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    (ws.root / "cases").mkdir(parents=True)
    return ws


def test_there_is_a_template_per_engine() -> None:
    assert {t[0] for t in ENGINES.values()} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_every_case_file_freezes(name: str, tmp_ws: Workspace) -> None:
    shutil.copy(CASES / name, tmp_ws.cases_dir / name)
    first = freeze_case(tmp_ws, f"cases/{name}")
    again = freeze_case(tmp_ws, f"cases/{name}")
    assert first.created and not again.created and again.case_id == first.case_id
    assert first.dataset_id and Path(first.path).is_file()
    assert draft(name)["$schema"] == "../schemas/case.schema.json"


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_engine_templates_name_their_cache_report_flags_and_counters(engine: str) -> None:
    name, family, argv_needs, note_needs = ENGINES[engine]
    d = draft(name)
    case = Case.model_validate(d).filled()
    assert case.service.adapter == "command" and case.service.argv
    assert case.measurement.spec_decode == family
    assert case.service.health_url and case.target.metrics_url
    missing = [a for a in argv_needs if a not in case.service.argv]
    assert not missing, f"{name}: argv lacks {missing}"
    absent = [n for n in note_needs if n not in d["note"]]
    assert not absent, f"{name}: the note does not name {absent}"
    # the launch argv caseledger will compare with /proc: placeholders filled from the first endpoint
    port = case.target.endpoints[0].base_url.rsplit(":", 1)[1].split("/")[0]
    argv = intended_argv(case)
    assert not any("{" in a and "}" in a and not a.startswith("{\"") for a in argv), argv
    if "{port}" in case.service.argv:
        assert port in argv
