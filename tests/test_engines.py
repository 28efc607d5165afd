"""Engine profiles: one module per engine holds its /metrics names, weight options and version endpoint; nothing
outside caseledger/engines names an engine's counter; an engine added as a profile is read end to end (here TGI,
served by the reference target under TGI's names and /info)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from caseledger import engines
from caseledger.case.service import ReferenceConfig
from caseledger.case.store import validate
from caseledger.engines.profile import EngineProfile
from tests.conftest import Served, ref_draft, reference_targets

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
    from caseledger.run.load_failures import IN_FLIGHT_GAUGES
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
        EngineProfile(name="x", what="x", metrics={"tokens": "x_tokens"})
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

    from caseledger.run.load_failures import in_flight
    from caseledger.services.identity import engine_version, units

    text = httpx2.get(as_tgi.url + "/metrics").text
    assert "tgi_queue_size{" in text and "tgi_batch_current_size{" in text and "vllm:" not in text
    assert httpx2.get(as_tgi.url + "/version").status_code == 404  # vLLM's endpoint is not TGI's
    port = int(as_tgi.url.rsplit(":", 1)[1])
    case = validate(ref_draft(port), "as tgi")
    assert in_flight(case) == 0.0  # read from tgi_batch_current_size + tgi_queue_size, idle
    version = engine_version(units(case)[0])
    assert version is not None and version.endswith("(as tgi) (/info)"), version
