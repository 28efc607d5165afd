"""Huawei MindIE Service (`mindieservice_daemon`, configured by its config.json): the weights and ports are in
that file (declared as the service's defining files), not in the argv."""

from caseledger.engines.profile import EngineProfile

PROFILE = EngineProfile(
    name="mindie",
    rank=6,
    what="MindIE: mindieservice_daemon with its config.json",
    spec_missing="MindIE's speculative counters are not read by caseledger",
    commands=("mindieservice_daemon",),
)
