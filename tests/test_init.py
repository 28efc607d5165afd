"""`caseledger init`: a workspace in an empty folder whose template, once its marked values are filled, freezes;
`$schema` resolves there; nothing is overwritten; a bad argument writes nothing. `caseledger schema` writes into
the workspace, never into the installation."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from caseledger import cli
from caseledger.case.schema import CASE_SCHEMA, PACKAGED_SCHEMAS, case_schema
from caseledger.case.store import FILL_MARK, unfilled
from caseledger.errors import CaseInvalid
from caseledger.init import ENGINES, TEMPLATES
from caseledger.tools import freeze_case
from caseledger.workspace import Workspace
from tests.conftest import tree_digest

ROOT = Path(__file__).resolve().parent.parent
BUILTIN_TOKENIZER = str(ROOT / "caseledger" / "data" / "tokenizer")  # a tokenizer directory, as a model's is


def call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def fill(value: str, port: int) -> str:
    """What a user puts where the template says <FILL: ...>: a port, a program, the model (directory or GGUF)."""
    what = value[value.index(FILL_MARK) :]
    if "port" in what:
        return value.replace(what[: what.index(">") + 1], str(port))
    if "base URL" in what:
        return f"http://127.0.0.1:{port}/v1"
    if "model name" in what:
        return "my-model"
    if "program" in what or "python" in what:
        return "/usr/bin/true"  # freeze starts nothing: any program will do for it
    gguf = os.environ.get("CASELEDGER_LLAMA_MODEL", "")
    if "gguf" in what and Path(gguf).is_file():
        return gguf  # the served GGUF is its own tokenizer
    return BUILTIN_TOKENIZER  # a model directory (its tokenizer), or a GGUF where no llama.cpp model is here


def filled(d: Any, port: int) -> Any:  # JSON: a draft, walked
    if isinstance(d, str):
        return fill(d, port) if FILL_MARK in d else d
    if isinstance(d, dict):
        return {k: filled(v, port) for k, v in d.items()}
    if isinstance(d, list):
        return [filled(v, port) for v in d]
    return d


@pytest.mark.parametrize("engine", ENGINES)
def test_init_in_an_empty_folder_then_filling_the_marked_values_gives_a_template_that_freezes(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "new"
    rc, out, err = call(["init", str(root), "--engine", engine], capsys)
    monkeypatch.chdir(root)  # as its user goes on: in the new workspace (freeze reads cases/ from the cwd first)
    assert rc == 0, err
    template = root / "cases" / f"{engine}.json"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(
        [".mcp.json", "HANDOFF.md", f"cases/{engine}.json", "cases/sweep.json", f"schemas/{CASE_SCHEMA}"]
    )
    draft = orjson.loads(template.read_bytes())
    marked = [path for path, _ in unfilled(draft)]
    assert (marked == []) == (engine == "reference"), marked  # every engine but the reference has values to fill
    for path in marked:
        assert path in out and path in (root / "HANDOFF.md").read_text()
    # $schema resolves from the new workspace, to this version's schema, and the template validates against it
    schema_file = (template.parent / draft["$schema"]).resolve()
    assert schema_file == root / "schemas" / CASE_SCHEMA and schema_file.read_bytes() == case_schema()
    mcp = orjson.loads((root / ".mcp.json").read_bytes())["mcpServers"]["caseledger"]
    assert mcp["args"] == ["mcp", "--workspace", str(root)] and Path(mcp["command"]).name == "caseledger"

    if marked:  # unfilled: refused, each marked field named, nothing written
        before = tree_digest(root)
        rc, _, err = call(["-w", str(root), "freeze", f"cases/{engine}.json"], capsys)
        assert rc == 2 and all(p in err for p in marked) and "fix: replace each '<FILL" in err, err
        assert tree_digest(root) == before
    template.write_bytes(orjson.dumps(filled(draft, 18123), option=orjson.OPT_INDENT_2))
    jsonschema.validate(orjson.loads(template.read_bytes()), orjson.loads(schema_file.read_bytes()))
    rc, out, err = call(["-w", str(root), "--json", "freeze", f"cases/{engine}.json"], capsys)
    assert rc == 0, err
    frozen = orjson.loads(out)
    assert frozen["case_id"].startswith("c-") and frozen["created"] and frozen["dataset_id"]
    # the C sweep under a TTFT p99 limit freezes as written, over the same filled draft: one campaign, five points
    rc, out, err = call(["-w", str(root), "--json", "freeze", "cases/sweep.json"], capsys)
    assert rc == 0, err
    sweep = orjson.loads(out)
    assert sweep["campaign_id"].startswith("g-") and sorted(sweep["points"]) == ["C=1", "C=16", "C=2", "C=4", "C=8"]
    assert "ttft_p99_ms" in (root / "cases" / "sweep.json").read_text()


def test_init_twice_keeps_every_file_and_says_what_it_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ws"
    (root / "cases").mkdir(parents=True)
    mine = b'{"scenario": "mine"}\n'
    (root / "cases" / "vllm.json").write_bytes(mine)
    other = b'{"mcpServers": {"other": {"command": "x"}}}\n'
    (root / ".mcp.json").write_bytes(other)
    rc, out, err = call(["init", str(root), "--engine", "vllm"], capsys)
    assert rc == 0, err
    assert (root / "cases" / "vllm.json").read_bytes() == mine and (root / ".mcp.json").read_bytes() == other
    assert "kept cases/vllm.json (exists; never overwritten)" in out
    assert "kept .mcp.json (exists without a 'caseledger' server: add {\"caseledger\"" in out
    assert f"wrote schemas/{CASE_SCHEMA}" in out and "wrote HANDOFF.md" in out
    before = tree_digest(root)
    rc, out, _ = call(["init", str(root), "--engine", "vllm"], capsys)
    assert rc == 0 and tree_digest(root) == before
    assert "wrote" not in out and out.count("kept ") == 5, out


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str, str]]:
    """name -> (argv, what the error names, what the fix says)"""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    blocked = tmp_path / "blocked"
    (blocked / ".mcp.json").mkdir(parents=True)
    return {
        "unknown engine": (["init", str(tmp_path / "n1"), "--engine", "vlm"], "--engine 'vlm'", "--engine vllm|sglang"),
        "no engine": (["init", str(tmp_path / "n2")], "needs --engine", "--engine vllm|sglang"),
        "DIR is a file": (["init", str(a_file), "--engine", "vllm"], "DIR", "give a new or existing directory"),
        "DIR under a file": (["init", str(a_file / "sub"), "--engine", "vllm"], "not writable", "give a DIR"),
        "two workspaces": (
            ["init", str(tmp_path / "n3"), "-w", str(tmp_path / "n4"), "--engine", "vllm"],
            "--workspace",
            "give one of them",
        ),
        "a directory where .mcp.json goes": (["init", str(blocked), "--engine", "vllm"], ".mcp.json", "move"),
    }


@pytest.mark.parametrize(
    "name",
    [
        "unknown engine",
        "no engine",
        "DIR is a file",
        "DIR under a file",
        "two workspaces",
        "a directory where .mcp.json goes",
    ],
)
def test_a_bad_argument_is_named_with_its_fix_and_nothing_is_written(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, names, fix = _bad_inputs(tmp_path)[name]
    before = tree_digest(tmp_path)
    rc, out, err = call(argv, capsys)
    assert rc == 2 and out == "", out
    message, _, fix_line = err.partition("\nfix: ")
    assert message.startswith("error: ") and names in message, err
    assert fix in fix_line and "nothing was written" in fix_line, err
    assert tree_digest(tmp_path) == before


def test_a_read_only_parent_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("running as a user who writes anywhere (root)")
        rc, _, err = call(["init", str(parent / "ws"), "--engine", "reference"], capsys)
        assert rc == 2 and f"not writable: {parent}" in err and "fix: " in err, err
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def test_freeze_names_every_value_left_to_fill_in_an_inline_draft_too(ws: Workspace) -> None:
    draft = orjson.loads((TEMPLATES / "external.json").read_bytes())
    before = tree_digest(ws.root)
    with pytest.raises(CaseInvalid) as e:
        freeze_case(ws, draft=draft)
    assert e.value.message.startswith("inline draft still has 3 value(s) to fill: target.endpoints[0].base_url = ")
    assert "target.endpoints[0].model" in e.value.message and "dataset.tokenizer" in e.value.message
    assert tree_digest(ws.root) == before


def test_schema_writes_into_the_workspace_never_into_the_installation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    packaged = PACKAGED_SCHEMAS / CASE_SCHEMA
    stamp = packaged.stat().st_mtime_ns
    rc, out, err = call(["-w", str(tmp_path), "schema"], capsys)
    assert rc == 0, err
    assert out.split() == [str(tmp_path / "schemas" / CASE_SCHEMA)]
    assert (tmp_path / "schemas" / CASE_SCHEMA).read_bytes() == case_schema()
    assert packaged.stat().st_mtime_ns == stamp


def test_the_packaged_schema_is_not_stale() -> None:
    assert (PACKAGED_SCHEMAS / CASE_SCHEMA).read_bytes() == case_schema(), (
        "caseledger/data/schemas/case.schema.json is stale: run `caseledger schema --package` in the checkout"
    )


def test_what_init_copies_ships_with_the_package() -> None:
    """pyproject's package data covers every file init reads (the templates, the schema): an installed caseledger
    has them, not only a checkout."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["caseledger"]
    # setuptools' globs: '*' stays inside one directory, '**' crosses them
    rules = [
        re.compile("".join(".*" if t == "**" else "[^/]*" if t == "*" else re.escape(t) for t in split(g)))
        for g in globs
    ]
    needed = [*(TEMPLATES / f"{e}.json" for e in ENGINES), PACKAGED_SCHEMAS / CASE_SCHEMA]
    for p in needed:
        rel = p.relative_to(ROOT / "caseledger").as_posix()
        assert p.is_file() and any(r.fullmatch(rel) for r in rules), (rel, globs)


def split(glob: str) -> list[str]:
    return [t for t in re.split(r"(\*\*|\*)", glob) if t]
