"""A changed argv is named by the flags that changed, never by the whole command line."""

from __future__ import annotations

from caseledger.case.plan import argv_change

BASE = ["/opt/llama/bin/llama-server", "-m", "/models/gemma.gguf", "--port", "8080", "-np", "4", "--metrics"]


def test_a_changed_flag_value_reads_old_to_new() -> None:
    assert argv_change(BASE, [*BASE[:6], "2", "--metrics"]) == "-np 4→2"


def test_added_and_removed_flags_are_named() -> None:
    assert argv_change(BASE, [*BASE, "-fa"]) == "-fa added"
    assert argv_change(BASE, [*BASE, "-c", "8192"]) == "-c 8192 added"
    assert argv_change(BASE, BASE[:-1]) == "--metrics removed"


def test_a_python_module_prefix_is_the_program_not_a_flag() -> None:
    old = ["python", "-m", "vllm.entrypoints.openai.api_server", "--max-model-len", "2048"]
    new = ["python", "-m", "vllm.entrypoints.openai.api_server", "--max-model-len=4096"]
    assert argv_change(old, new) == "--max-model-len 2048→4096"


def test_no_option_change_or_no_argv_gives_none() -> None:
    assert argv_change(BASE, list(BASE)) is None
    assert argv_change(4, 2) is None and argv_change(BASE, "x") is None
