"""Engine profiles: one module per engine holds its /metrics names, weight options, commands and version endpoint;
nothing outside caseledger/engines names an engine's counter; an engine added as a profile is read end to end (here
TGI, served by the reference target under TGI's names and /info), and detected at each start (service.engine)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from caseledger import engines
from caseledger.case.service import ReferenceConfig
from caseledger.case.store import validate
from caseledger.engines.profile import EngineProfile
from caseledger.errors import CaseInvalid
from caseledger.services.identity import metric_names
from caseledger.tools import freeze_case, phase_status, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import Served, free_port, ref_draft, reference_targets
from tests.helpers import target_argv

PACKAGE = Path(__file__).resolve().parent.parent / "caseledger"


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_counter_name_is_written_outside_its_engine_profile() -> None:
    names = {n for p in engines.PROFILES.values() for role in p.metrics for n in p.names(role)}
    prefixes = {n.split(":")[0] + ":" for n in names if ":" in n} | {
        n.split("_")[0] + "_" for n in names if ":" not in n
    }
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {text[:80]!r}"
        for path in PACKAGE.rglob("*.py")
        if "engines" not in path.relative_to(PACKAGE).parts
        for line, text in _strings(path)
        if any(text.removesuffix("_total").startswith(n.removesuffix("_total")) for n in names)
        or any(text.startswith(p) and len(text) > len(p) and " " not in text for p in prefixes)
    ]
    assert found == [], "an engine's counter name belongs in its profile (caseledger/engines)"


def test_the_tables_that_read_engines_are_built_from_the_profiles() -> None:
    from caseledger.metrics._checks import GENERATION_COUNTERS
    from caseledger.metrics._spec import FAMILIES
    from caseledger.run.load.failures import IN_FLIGHT_GAUGES
    from caseledger.services.identity import MODEL_FILE_OPTIONS, weight_args

    assert set(FAMILIES) == {"vllm", "sglang", "llamacpp"}  # the engines with a speculative verify counter
    assert "llamacpp:n_drafted_total" in FAMILIES["llamacpp"].draft_tokens  # an older build's name, kept
    assert "tgi_queue_size" in IN_FLIGHT_GAUGES and "llamacpp:tokens_predicted_total" in GENERATION_COUNTERS
    assert "--model-id" in MODEL_FILE_OPTIONS and "--model-path" in MODEL_FILE_OPTIONS
    argv = ["text-generation-launcher", "--model-id=/w/a", "x", "trtllm-serve", "/w/b", "--model-path", "/w/c"]
    assert weight_args(argv) == [("--model-id", "/w/a"), ("serve", "/w/b"), ("--model-path", "/w/c")]


def test_an_unknown_engine_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known engines are vllm, sglang, llamacpp, tgi"):
        engines.profile("tensorflow-serving")
    with pytest.raises(ValueError, match=r"metrics_as 'nope' is not an engine profile: use one of vllm"):
        ReferenceConfig.model_validate({"metrics_as": "nope"})
    with pytest.raises(ValueError, match="unknown metric roles"):
        EngineProfile(name="x", rank=0, what="x", metrics={"tokens": "x_tokens"})
    # the default is left out of the canonical form: cases frozen before the field keep their ids
    assert "metrics_as" not in ReferenceConfig.model_validate({}).model_dump(mode="json")


@pytest.fixture(scope="module")
def as_tgi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    cfg = {"prefill_tokens_per_s": 1e7, "decode_step_s": 0.0, "decode_step_per_seq_s": 0.0, "metrics_as": "tgi"}
    with reference_targets({"tgi": cfg}, tmp_path_factory.mktemp("tgi")) as out:
        yield out["tgi"]


@pytest.mark.integration
def test_an_engine_added_as_a_profile_is_read_by_caseledger_from_its_own_names(as_tgi: Served) -> None:
    """The reference target served as TGI: its /metrics carries TGI's gauges (no vLLM name), its version is at
    TGI's /info; caseledger's in-flight check and version probe read them through the profile alone."""
    import httpx2

    from caseledger.run.load.failures import in_flight
    from caseledger.services.identity import engine_version, units

    text = httpx2.get(as_tgi.url + "/metrics").text
    assert "tgi_queue_size{" in text and "tgi_batch_current_size{" in text and "vllm:" not in text
    assert httpx2.get(as_tgi.url + "/version").status_code == 404  # vLLM's endpoint is not TGI's
    port = as_tgi.port
    case = validate(ref_draft(port), "as tgi")
    assert in_flight(case) == 0.0  # read from tgi_batch_current_size + tgi_queue_size, idle
    version, path = engine_version(units(case)[0])
    assert version is not None and version.endswith("(as tgi) (/info)") and path == "/info", version
    # detected from its version endpoint (TGI's alone), and from its /metrics names when nothing else tells
    assert engines.detect(["python3", "-m", "caseledger.target", "serve"], path) == "tgi (/info)"
    assert engines.detect([], None, metric_names(as_tgi.url + "/metrics")) == "tgi (/metrics: 2 of its names)"


@pytest.mark.parametrize(
    ("argv", "version_path", "names", "found"),
    [
        (["/opt/llama.cpp/build/bin/llama-server", "-m", "m.gguf"], None, [], "llamacpp (argv: llama-server)"),
        (["vllm", "serve", "/models/qwen"], "/version", [], "vllm (argv: vllm)"),
        (
            ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            None,
            [],
            "vllm (argv: vllm.entrypoints.openai.api_server)",
        ),
        (
            ["python3", "-m", "sglang.launch_server", "--model-path", "/m"],
            None,
            [],
            "sglang (argv: sglang.launch_server)",
        ),
        (["/usr/local/bin/trtllm-serve", "/engines/llama"], "/version", [], "trtllm (argv: trtllm-serve)"),
        (["text-generation-launcher", "--model-id", "/m"], None, [], "tgi (argv: text-generation-launcher)"),
        (["./mindieservice_daemon"], None, [], "mindie (argv: mindieservice_daemon)"),
        # a wrapper script: its version endpoint when one engine alone has it, else its /metrics names
        (["./serve.sh"], "/props", [], "llamacpp (/props)"),
        (
            ["./serve.sh"],
            "/version",
            ["vllm:num_requests_running", "vllm:prompt_tokens_total"],
            "vllm (/metrics: 2 of its names)",
        ),
        (["./serve.sh"], "/version", [], None),  # vLLM and trtllm-serve both answer /version: not told apart
        (["./serve.sh"], None, ["process_cpu_seconds_total"], None),
    ],
)
def test_the_engine_is_detected_from_its_command_then_its_version_endpoint_then_its_metrics(
    argv: list[str], version_path: str | None, names: list[str], found: str | None
) -> None:
    assert engines.detect(argv, version_path, names) == found


def test_a_declared_engine_must_be_a_profile_and_a_launched_one() -> None:
    draft = ref_draft(18125, service={"adapter": "command", "argv": ["srv"], "engine": "tensorrt"})
    with pytest.raises(CaseInvalid, match=r"service.engine 'tensorrt' is not an engine profile: use one of vllm"):
        validate(draft, "engine")
    with pytest.raises(
        CaseInvalid, match=r"service.engine is checked at a start by adapter 'command', not 'reference'"
    ):
        validate(ref_draft(18125, service={"engine": "vllm"}), "engine")
    # left out of the canonical form when null: cases frozen before the field keep their ids
    assert "engine" not in validate(ref_draft(18125), "engine").model_dump(mode="json")["service"]


@pytest.mark.integration
@pytest.mark.parametrize("declared", ["tgi", "vllm"])
def test_a_start_records_the_engine_it_detected_and_fails_when_the_case_declares_another(
    ws: Workspace, stop_services: None, declared: str
) -> None:
    """A command service that is the reference target serving TGI's names: detected as tgi from /info, recorded in
    the service evidence; a case declaring vllm fails at the service phase naming both, before any request."""
    port = free_port()
    config = '{"metrics_as": "tgi", "decode_step_s": 0.0, "decode_step_per_seq_s": 0.0}'
    argv = [*target_argv(), "--config-json", config]
    draft = ref_draft(port, service={"adapter": "command", "argv": argv, "engine": declared})
    draft["load"] = {**draft["load"], "requests": 2}
    case = freeze_case(ws, draft=draft)
    r = start_run(ws, case.case_id, wait=True)
    st = phase_status(ws, r.run_id)
    evidence = read_json(ws.run(r.run_id).phase_file("service"))
    if declared == "tgi":
        assert st.state == "succeeded" and evidence["engine"] == "tgi (/info)", (st.text(), evidence)
        return
    assert st.state == "failed" and st.phase == "service" and st.failure_class == "service", st.text()
    assert "is tgi (/info), not the service.engine 'vllm'" in (st.blocker or ""), st.text()
    assert "freeze a case with service.engine 'tgi' (or null)" in st.text() and st.sent == 0, st.text()
