"""The case files in cases/: every one freezes, and the engine templates carry what caseledger reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger.case.model import Case
from caseledger.case.store import load_case
from caseledger.services import intended_argv
from caseledger.services.identity import units
from caseledger.tools import freeze_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.tools.freeze_case import FreezeResult
from caseledger.workspace import Workspace
from tests.engine import VLLM_TEMPLATE_MODEL, llama_paths, vllm_paths

CASES = Path(__file__).resolve().parent.parent / "cases"
ALL = sorted(p.name for p in CASES.glob("*.json"))

# engine -> (template, spec-decode counter family, what must be in the argv, what the note must name)
ENGINES: dict[str, tuple[str, str, list[str], list[str]]] = {
    "llamacpp": (
        "llamacpp.json",
        "llamacpp",
        ["--metrics", "--swa-full", "--host", "{host}", "--port", "{port}"],
        [
            "cached_tokens",
            "llamacpp:spec_decode_num_drafts_total",
            "llamacpp:spec_decode_num_accepted_tokens_total",
            "llamacpp:prompt_tokens_total",
        ],
    ),
    "llamacpp-spec": (
        "llamacpp-spec.json",
        "llamacpp",
        [
            "--metrics",
            "-md",
            "{draft_model}",
            "--spec-type",
            "{spec_type}",
            "--spec-draft-n-max",
            "{draft_max}",
            "{port}",
        ],
        [
            "timings.draft_n",
            "timings.draft_n_accepted",
            "llamacpp:spec_decode_num_drafts_total",
            "llamacpp:spec_decode_num_draft_tokens_total",
            "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
        ],
    ),
    "vllm": (
        "vllm.json",
        "vllm",
        ["vllm.entrypoints.openai.api_server", "--enable-prompt-tokens-details", "--chat-template", "{port}"],
        [
            "cached_tokens",
            "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total",
            "/reset_prefix_cache",
        ],
    ),
    "vllm-spec": (
        "vllm-spec.json",
        "vllm",
        ["vllm.entrypoints.openai.api_server", "--enable-prompt-tokens-details", "--speculative-config", "{port}"],
        [
            "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total",
            "NOT_OBSERVED",
        ],
    ),
    "sglang": (
        "sglang.json",
        "sglang",
        ["sglang.launch_server", "--enable-cache-report", "--enable-metrics", "--speculative-algorithm", "{port}"],
        ["cached_tokens", "sglang:spec_verify_calls_total", "sglang:cached_tokens_total", "/flush_cache"],
    ),
    "mindie": (
        "mindie.json",
        "none",
        [],
        ["cached_tokens", "MIES_CONFIG_JSON_PATH", "prefix_cache", "enablePrefixCache", "MIES_SERVICE_MONITOR_MODE"],
    ),
}


def engines_doc_entry(name: str) -> str:
    """The paragraph of docs/engines.md that explains cases/<name> (its `note` is one line)."""
    doc = (CASES.parent / "docs" / "engines.md").read_text()
    start = doc.index(f"- **`cases/{name}`**:")
    end = doc.find("\n- **`cases/", start + 1)
    return doc[start : end if end != -1 else len(doc)]


@pytest.mark.parametrize("name", ALL)
def test_every_template_note_is_one_line_and_its_explanation_is_in_the_docs(name: str) -> None:
    d = draft(name)
    note = d.get("campaign", d).get("note") or ""
    assert len(note) <= 200 and "\n" not in note, f"{name}: a {len(note)}-char note; explain it in docs/engines.md"
    if "docs/engines.md" in note:
        assert engines_doc_entry(name)


def draft(name: str) -> dict[str, Any]:
    return dict(orjson.loads((CASES / name).read_bytes()))


@pytest.fixture
def tmp_ws(tmp_path: Path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    (ws.root / "cases").mkdir(parents=True)
    return ws


def test_there_is_a_template_per_engine() -> None:
    assert {t[0] for t in ENGINES.values()} <= set(ALL)


def _fill(ws: Workspace, d: dict[str, Any]) -> None:
    """A template's case draft made to freeze here: the model files it names linked into the workspace."""
    tok = d["dataset"].get("tokenizer", "builtin")
    if tok.endswith(".gguf"):  # the served model's own file, relative to the workspace: the engine tests' GGUF
        _, model = llama_paths()
        if not (ws.root / tok).exists():
            (ws.root / tok).parent.mkdir(parents=True, exist_ok=True)
            (ws.root / tok).symlink_to(model)
    elif tok == VLLM_TEMPLATE_MODEL:  # the served model's directory: the vLLM tests' bf16 Gemma
        (ws.root / tok).parent.mkdir(parents=True, exist_ok=True)
        (ws.root / tok).symlink_to(vllm_paths().model)
    elif tok != "builtin" and not Path(tok).exists():  # a model of an engine that cannot run here: its tokenizer
        d["dataset"]["tokenizer"] = "builtin"  # is absent, the rest of the template must still freeze
    if d["dataset"].get("path"):  # a prompts file or trace the template names, relative to the workspace
        (ws.root / d["dataset"]["path"]).write_bytes((CASES.parent / d["dataset"]["path"]).read_bytes())


@pytest.mark.parametrize("name", ALL)
def test_every_case_file_freezes(name: str, tmp_ws: Workspace) -> None:
    d = draft(name)
    if "campaign" in d:  # a campaign template: its base is a case draft, every point a frozen case
        _fill(tmp_ws, d["campaign"]["base"])
    else:
        _fill(tmp_ws, d)
    (tmp_ws.cases_dir / name).write_bytes(orjson.dumps(d))
    first = freeze_any(tmp_ws, tmp_ws.cases_dir / name)  # the filled copy, not the project's cases/ (the cwd)
    again = freeze_any(tmp_ws, tmp_ws.cases_dir / name)
    if isinstance(first, CampaignFrozen):
        assert isinstance(again, CampaignFrozen) and again.campaign_id == first.campaign_id
        assert first.created and not again.created and again.points == first.points
        points = len(d["campaign"]["axes"][0]["values"]) * (
            len(d["campaign"]["axes"][1]["values"]) if len(d["campaign"]["axes"]) > 1 else 1
        )
        assert len(first.points) == points and all(load_case(tmp_ws, c) for c in first.points.values())
        return
    assert isinstance(again, FreezeResult) and isinstance(first, FreezeResult)
    assert first.created and not again.created and again.case_id == first.case_id
    assert first.dataset_id and Path(first.path).is_file()
    assert draft(name)["$schema"] == "../schemas/case.schema.json"


def served_models(d: dict[str, Any]) -> list[str]:
    """The model paths a template's argvs serve: -m (llama.cpp), --model (vLLM), --model-path (SGLang), the
    argument after `serve` (`vllm serve M`)."""
    sv = d["service"]
    out = []
    for argv in [sv["argv"]] if sv.get("argv") else [c["argv"] for c in sv["components"]]:
        out += [argv[k + 1] for k, a in enumerate(argv[:-1]) if a in ("-m", "--model", "--model-path", "serve")]
    return out


@pytest.mark.parametrize("name", [n for n in ALL if not n.startswith("ref-")])
def test_real_engine_templates_count_tokens_with_the_served_model(name: str) -> None:
    """A builtin tokenizer plans other token counts than a real model serves (route_verify stops the run): every
    real-engine template points dataset.tokenizer at the model its engine loads, or names where it is."""
    d = draft(name)
    d = d["campaign"]["base"] if "campaign" in d else d
    tok = d["dataset"]["tokenizer"]
    assert tok != "builtin"
    served = served_models(d)
    if served:
        assert tok in served, f"{name}: dataset.tokenizer {tok} is not the served model {served}"
    else:  # MindIE: the daemon takes no options, config.json names the weights
        assert "modelWeightPath" in d["note"] and "tokenizer" in d["note"], d["note"]


# multi-process templates: engine -> (template, component roles in start order, what each argv must hold)
PD: dict[str, tuple[str, list[str], dict[str, list[str]]]] = {
    "vllm-pd": (
        "vllm-pd.json",
        ["prefill", "decode", "router"],
        {
            "prefill": ["--kv-transfer-config", "--enable-prompt-tokens-details"],
            "decode": ["--kv-transfer-config", "--enable-prompt-tokens-details"],
            "router": ["--prefiller-ports", "--decoder-ports", "{port}"],
        },
    ),
    "sglang-pd": (
        "sglang-pd.json",
        ["prefill", "decode", "router"],
        {
            "prefill": ["--disaggregation-mode", "prefill", "--enable-cache-report"],
            "decode": ["--disaggregation-mode", "decode", "--enable-cache-report"],
            "router": ["--pd-disaggregation", "--prefill", "--decode", "{port}"],
        },
    ),
    "mindie-dp2": ("mindie-dp2.json", ["worker", "worker"], {"worker": []}),
}


@pytest.mark.parametrize("engine", sorted(PD))
def test_multi_process_templates_declare_their_components(engine: str) -> None:
    name, roles, needs = PD[engine]
    d = draft(name)
    case = Case.model_validate(d).filled()
    comps = case.service.components
    assert [c.role for c in comps] == roles and not case.service.argv
    assert d["note"].startswith("UNVERIFIED"), "a template no engine ran here says so first"
    for c in comps:
        missing = [a for a in needs[c.role] if a not in c.argv]
        assert not missing, f"{name} {c.name}: argv lacks {missing}"
    # every endpoint is served by one component; each component's argv is filled from its own route
    served = sorted(r for c in comps for r in c.routes)
    assert served == list(range(len(case.target.endpoints)))
    for u in units(case):
        argv = intended_argv(case, u)
        assert not any(p in a for a in argv for p in ("{host}", "{port}", "{model}")), argv
        if u.routes and any("{port}" in a for a in u.argv):
            assert case.target.endpoints[u.routes[0]].base_url.rsplit(":", 1)[1].split("/")[0] in argv


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
    entry = engines_doc_entry(name)  # the note is one line; what it explained is in docs/engines.md
    absent = [n for n in note_needs if n not in entry]
    assert not absent, f"{name}: docs/engines.md's entry does not name {absent}"
    # the launch argv caseledger will compare with /proc: placeholders filled from the first endpoint
    port = case.target.endpoints[0].base_url.rsplit(":", 1)[1].split("/")[0]
    argv = intended_argv(case)
    assert not any("{" in a and "}" in a and not a.startswith('{"') for a in argv), argv
    if "{port}" in case.service.argv:
        assert port in argv
