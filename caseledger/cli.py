"""The `caseledger` command: the six tools one to one, plus init, authorize, mcp, inspect, demo and helpers.

Every command prints the same short answer as the MCP tool (`--json` for the structured form), with the
values of the workspace's secrets masked as *** (caseledger.redact).
Business errors (a read-only workspace too: "not writable: PATH") print `error: ...` and `fix: ...` to
stderr and exit 2; a bug prints the same two lines and exits 1 (CASELEDGER_DEBUG=1 shows its traceback).
Heavy modules (mcp, transformers, numpy) are imported only by the commands that need them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, get_args

import orjson

from caseledger import engines, redact
from caseledger.errors import CaseledgerError, Unexpected, unexpected
from caseledger.ledger import authorization, calls, indexdb
from caseledger.records import NativeRule
from caseledger.target.options import add_serve_arguments
from caseledger.workspace import Workspace, steps

if TYPE_CHECKING:
    from caseledger.run.progress import ProgressLine
    from caseledger.tools import SummaryResult


def _emit(result: Any, as_json: bool) -> None:
    # the last line of defence: text an older version recorded unmasked is masked as it leaves
    secrets = redact.current()
    if as_json:  # masked string by string, so the JSON stays valid
        body = orjson.dumps(secrets.mask_obj(result.model_dump(mode="json")), option=orjson.OPT_INDENT_2)
        sys.stdout.write(body.decode() + "\n")
    else:  # the next calls in the CLI's words
        sys.stdout.write(secrets.mask(calls.as_cli(result.text())) + "\n")


def _emit_summary(result: SummaryResult, as_json: bool) -> None:
    """The answer, then (as text) the side-by-side tables of several runs. A reader: nothing is written (the
    charts: `caseledger report --html` writes a page with them)."""
    _emit(result, as_json)
    if not as_json and result.side_by_side:
        sys.stdout.write("\n" + redact.current().mask(result.side_by_side) + "\n")


def _print(structured: dict[str, Any], text: str, as_json: bool) -> None:  # JSON: a tool's answer, printed
    secrets = redact.current()
    sys.stdout.write(
        (orjson.dumps(secrets.mask_obj(structured)).decode() if as_json else secrets.mask(calls.as_cli(text))) + "\n"
    )


@contextmanager
def _live(a: argparse.Namespace) -> Iterator[ProgressLine | None]:
    """The live progress of `run --wait` / `resume --wait`: redrawn in place on a terminal, a line per phase
    change otherwise, nothing with --json (stdout is then the structured answer alone)."""
    if not getattr(a, "wait", False) or a.json:
        yield None
        return
    from caseledger.run.progress import ProgressLine  # lazy: the case models, see _dispatch

    line = ProgressLine(sys.stdout, tty=sys.stdout.isatty())
    try:
        yield line
    finally:
        line.close()


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: an option given before the command ("caseledger -w W status") is not reset by the
    # subcommand's own default (the parsers share these actions); main() fills the defaults in
    common.add_argument(
        "--workspace",
        "-w",
        default=argparse.SUPPRESS,
        help="workspace directory (env CASELEDGER_WORKSPACE; default: current directory)",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the structured answer as JSON"
    )
    p = argparse.ArgumentParser(
        prog="caseledger", description=__doc__.splitlines()[0] if __doc__ else None, parents=[common]
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _run_commands(sub, common)
    _read_commands(sub, common)
    _other_commands(sub, common)
    return p


_Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # what add_subparsers returns (typeshed's name)


def _run_commands(sub: _Sub, common: argparse.ArgumentParser) -> None:
    """The commands of the six tools that start or change runs: freeze, run, status, resume, reprocess."""
    s = sub.add_parser("freeze", parents=[common], help="freeze a case or campaign draft (freeze_case)")
    s.add_argument("path")
    s.add_argument("--parent", default=None, help="parent case id (overrides the draft's parent)")

    s = sub.add_parser("run", parents=[common], help="start a run of a frozen case, or a campaign g-... (start_run)")
    s.add_argument("case_id")
    s.add_argument("--wait", action="store_true", help="wait for the whole run, not just preflight")
    s.add_argument(
        "--preflight-only",
        action="store_true",
        help="check the case in a fresh socket-less process; no run, no lease (allowed while paused)",
    )
    s.add_argument(
        "--queue",
        action="store_true",
        help="if the target is held: preflight now and start when it frees (authorization auto)",
    )

    s = sub.add_parser("status", parents=[common], help="where a run or a campaign stands (phase_status)")
    s.add_argument("run_id", nargs="?")
    s.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="answer when the run or campaign ends or needs you, or after S seconds (at most 600)",
    )
    s.add_argument("--each-change", action="store_true", help="with --wait: answer at every phase (or point) instead")

    s = sub.add_parser("resume", parents=[common], help="continue a run at its first unfinished phase (resume)")
    s.add_argument("run_id")
    s.add_argument("--wait", action="store_true")

    s = sub.add_parser("reprocess", parents=[common], help="recompute results from raw data (reprocess_raw)")
    s.add_argument("run_id")
    # choices = caseledger.metrics._models.NATIVE_RULES, spelled here rather than imported: `caseledger --help`
    # must not import numpy (tests/test_metrics.py checks the two agree); the ratio is checked by the processor
    s.add_argument(
        "--window",
        "--rule",
        dest="rule",
        choices=get_args(NativeRule),
        default=None,
        help="native window rule (default: the case's)",
    )
    s.add_argument("--ratio", type=float, default=None, help="sglang rule: share of peak concurrency")


def _read_commands(sub: _Sub, common: argparse.ArgumentParser) -> None:
    """The commands that read the ledger: summarize, report, handoff, index."""
    s = sub.add_parser("summarize", parents=[common], help="figures and reports of runs (summarize)")
    s.add_argument("run_ids", nargs="*")
    s.add_argument(
        "--scenario",
        default=None,
        help="one row per case of this scenario (default without run ids: the latest scenario)",
    )

    s = sub.add_parser(
        "report",
        parents=[common],
        help="a run's, a scenario's or a campaign's report (--html: one self-contained page to open in a browser)",
    )
    s.add_argument("run_ids", nargs="*", help="runs, or one campaign id g-...; none: the latest scenario or campaign")
    s.add_argument("--scenario", default=None, help="the report of this scenario")
    s.add_argument(
        "--html",
        action="store_true",
        help="write the HTML page (beside report.md; ledger/reports/ for a scenario or a campaign) and print its path",
    )

    sub.add_parser("handoff", parents=[common], help="regenerate and print HANDOFF.md")
    s = sub.add_parser(
        "index",
        parents=[common],
        help="the ledger's derived index (ledger/index.sqlite): its runs, the disagreements it repaired",
    )
    s.add_argument("--rebuild", action="store_true", help="rebuild it from the files (they stay the truth)")


def _other_commands(sub: _Sub, common: argparse.ArgumentParser) -> None:
    """Authorization, the MCP server and its inspector, the reference target, import, demo, schema, init."""
    s = sub.add_parser("authorize", parents=[common], help="set authorization: paused | single | auto")
    s.add_argument("mode", choices=["paused", "single", "auto"])

    s = sub.add_parser("mcp", parents=[common], help="serve the six tools over MCP (stdio by default)")
    s.add_argument("--http", default=None, metavar="HOST:PORT", help="streamable HTTP instead of stdio")
    s.add_argument(
        "--token-env",
        default=None,
        help="env var holding the bearer token every HTTP client needs (required with --http, loopback too)",
    )
    s.add_argument(
        "--read-token-env",
        default=None,
        help="env var holding a second, read-only token: phase_status, summarize and the resources only",
    )

    s = sub.add_parser(
        "inspect",
        parents=[common],
        help="list the MCP tools or call one over real stdio",
        description="Talk to `caseledger mcp` over a real stdio session. Verbs: (none) list the "
        "tools and their schemas; `resources` list the resources; `read URI` read one (e.g. "
        "caseledger://handoff); `call TOOL key=value ...` call a tool (e.g. call phase_status "
        "run_id=r-1a2b3c4d).",
    )
    s.add_argument("words", nargs="*", help="nothing | resources | read URI | call TOOL key=value ...")

    s = sub.add_parser("target", parents=[common], help="the embedded reference target; stop what runs here")
    # one parser per action (never a positional that swallows the rest): `target stop --help` is help, not a stop
    acts = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_serve_arguments(acts.add_parser("serve", parents=[common], help="run it in the foreground"))
    acts.add_parser(
        "stop",
        parents=[common],
        help="stop this workspace's campaign drivers, then its running runs (each keeps the records it has), "
        "then the services caseledger started in it (--workspace DIR: another workspace's, e.g. the one that "
        "keeps a target)",
    )

    s = sub.add_parser("import", parents=[common], help="import a peer tool's output as a run")
    s.add_argument("kind", choices=["aisbench"])
    s.add_argument("path")

    s = sub.add_parser("demo", parents=[common], help="end-to-end demo on the reference target in a temp workspace")
    s.add_argument("--keep", action="store_true", help="keep the temporary workspace")

    s = sub.add_parser(
        "schema",
        parents=[common],
        help="write the workspace's schemas/case.schema.json from the models (never into the installation)",
    )
    s.add_argument(
        "--package",
        action="store_true",
        help="also regenerate the package's generated files (caseledger/data/); only in a source checkout",
    )

    s = sub.add_parser(
        "init",
        parents=[common],
        help="a new workspace: cases/ with a template for the engine, schemas/, .mcp.json, HANDOFF.md",
        description="Write a workspace for one engine; a file already there is kept (and named), never overwritten.",
    )
    s.add_argument("dir", nargs="?", default=None, metavar="DIR", help="the workspace (default: the workspace)")
    s.add_argument(
        "--engine",
        default=None,
        metavar="ENGINE",
        help=f"{' | '.join(engines.templated())} (started by caseledger), external (a server already running), "
        "reference (the embedded reference target)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        workspace, as_json, rest = _globals(list(sys.argv[1:] if argv is None else argv))
    except CaseledgerError as e:
        return _refuse(e)
    args = _parser().parse_args(rest)
    args.workspace = workspace if workspace is not None else getattr(args, "workspace", None)
    args.json = as_json or getattr(args, "json", False)
    try:
        return _dispatch(args)
    except CaseledgerError as e:
        return _refuse(e)
    except Exception as e:  # a read-only workspace (exit 2), or a bug: the message and the fix (exit 1)
        err = unexpected(e)
        if isinstance(err, Unexpected) and os.environ.get("CASELEDGER_DEBUG"):
            raise  # the traceback only on request
        return _refuse(err)


def _globals(argv: list[str]) -> tuple[str | None, bool, list[str]]:
    """--workspace/-w and --json taken from any position (before or after the command, or among a
    command's own arguments such as `target stop`), so no position silently means the current directory."""
    workspace: str | None = None
    as_json = False
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--":
            rest += ["--", *it]
            break
        if arg in ("--workspace", "-w"):
            workspace = next(it, None)
            if workspace is None:
                raise CaseledgerError(f"{arg} needs a directory", f"{arg} PATH (or set CASELEDGER_WORKSPACE)")
        elif arg.startswith("--workspace="):
            workspace = arg.split("=", 1)[1]
        elif arg == "--json":
            as_json = True
        else:
            rest.append(arg)
    return workspace, as_json, rest


def _refuse(e: CaseledgerError) -> int:
    message, fix = e.shown()
    sys.stderr.write(f"error: {message}\n")
    if fix:
        sys.stderr.write(f"fix: {fix}\n")
    return e.exit_code


def _dispatch(a: argparse.Namespace) -> int:
    ws = Workspace.open(a.workspace)
    if a.cmd not in ("mcp", "init"):  # the server remembers them before every answer, and starts without reading
        # the cases; init may be given a DIR that is no workspace yet (or a file: refused by name)
        from caseledger.case.store import remember_secrets  # lazy: the case models (~0.2 s) `mcp` starts without

        remember_secrets(ws)  # answers mask the values of every frozen case's secrets, whichever run they show
    return _COMMANDS[a.cmd](ws, a)


# The tools are imported inside each command: they pull numpy (metrics, datasets), the server mcp, the target
# starlette, and `caseledger --help` stays light (tests/test_quality.py checks it).
def _freeze(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.tools import freeze_any  # lazy: see above

    # a slow step (hashing a GGUF, converting its tokenizer, generating the dataset) says what it does on stderr
    told = steps.Steps(say=lambda what: print(f"freeze: {what} ...", file=sys.stderr, flush=True), after_s=steps.SLOW_S)
    _emit(freeze_any(ws, a.path, parent=a.parent, steps=told), a.json)
    return 0


def _run(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.tools import StartResult, start_any  # lazy: see above

    with _live(a) as progress:
        r = start_any(ws, a.case_id, wait=a.wait, preflight_only=a.preflight_only, queue=a.queue, progress=progress)
    _emit(r, a.json)
    failed = isinstance(r, StartResult) and (r.preflight == "failed" or r.state in ("failed", "not_queued"))
    return 1 if failed else 0


def _status(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.tools import status_any  # lazy: see above

    _emit(status_any(ws, a.run_id, wait_s=a.wait, until="change" if a.each_change else "end"), a.json)
    return 0


def _resume(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.tools import resume_any  # lazy: see above

    with _live(a) as progress:
        resumed = resume_any(ws, a.run_id, wait=a.wait, progress=progress)
    _emit(resumed, a.json)
    return 0


def _reprocess(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.tools import reprocess_raw  # lazy: see above

    _emit(reprocess_raw(ws, a.run_id, rule=a.rule, ratio=a.ratio), a.json)
    return 0


def _summarize(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.tools import summarize  # lazy: see above

    _emit_summary(summarize(ws, a.run_ids, scenario=a.scenario), a.json)
    return 0


def _report(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.tools import html_report, summarize  # lazy: see above

    if a.html:
        _emit(html_report(ws, a.run_ids, scenario=a.scenario), a.json)
    else:  # the markdown: what summarize writes and answers
        _emit_summary(summarize(ws, a.run_ids, scenario=a.scenario), a.json)
    return 0


def _authorize(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.views import handoff  # lazy: see _dispatch

    mode = authorization.set_mode(ws, a.mode)
    handoff.refresh(ws)
    _print({"authorization": mode}, f"authorization: {mode}", a.json)
    return 0


def _handoff(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.views import handoff  # lazy: see _dispatch

    text = handoff.refresh(ws, verify=True)
    _print({"handoff": text, "path": str(ws.handoff)}, text.rstrip("\n"), a.json)
    return 0


def _index(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.ledger.index import open_index  # lazy: see _dispatch

    with open_index(ws, rebuild=a.rebuild) as idx:
        runs, damaged, notes = idx.count(), idx.damaged(), idx.notes()
        where = str(indexdb.path_of(ws.ledger)) if idx.persistent else "memory (the ledger is not writable)"
    lines = [
        f"index {where}: {runs} run(s), {len(damaged)} damaged entr{'y' if len(damaged) == 1 else 'ies'}"
        + ("; rebuilt from the files" if a.rebuild else "")
    ]
    lines += [f"noted {utc}: {text}" for utc, text in notes[-5:]]
    _print(
        {"path": where, "runs": runs, "damaged": damaged, "notes": [{"utc": u, "text": t} for u, t in notes]},
        "\n".join(lines),
        a.json,
    )
    return 0


def _mcp(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.server import serve  # lazy: mcp

    serve(ws, http=a.http, token_env=a.token_env, read_token_env=a.read_token_env)
    return 0


def _inspect(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.server.inspect import inspect_main  # lazy: mcp

    return inspect_main(ws, a.words, as_json=a.json)


def _target(ws: Workspace, a: argparse.Namespace) -> int:
    if a.action == "serve":
        from caseledger.target.server import serve  # lazy: starlette, only to serve

        return serve(a)
    from caseledger import services  # lazy: httpx2 and asyncssh
    from caseledger.run.campaign_driver import stop_drivers
    from caseledger.run.stop import stop_runs  # lazy: the ledger folds, only to stop

    drivers = stop_drivers(ws)  # first: a live driver would start the next point's service again
    runs = stop_runs(ws)  # then the runs, which end with the records they have while their services still run
    stopped = services.stop_all(ws)
    names = [f"campaign driver {g}" for g in drivers] + [f"run {r.line}" for r in runs] + stopped
    _print(
        {
            "stopped": stopped,
            "drivers": drivers,
            "runs": [{"run_id": r.run_id, "state": r.state, "line": r.line} for r in runs],
            "workspace": str(ws.root),
        },
        f"stopped: {', '.join(names) or 'nothing was running'} (workspace {ws.root})",
        a.json,
    )
    return 0


def _import(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.importers import import_run  # lazy: numpy

    rid = import_run(ws, a.kind, a.path)
    nxt = calls.run_succeeded(rid)
    _print({"run_id": rid, "next_call": nxt}, f"imported as run {rid}\nnext: {nxt}", a.json)
    return 0


def _demo(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.demo import demo  # lazy: the tools pull numpy

    return demo(keep=a.keep, as_json=a.json)


def _schema(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.case.schema import PACKAGED_SCHEMAS, write_schemas  # lazy: see _dispatch

    paths = write_schemas(ws.root / "schemas")
    if a.package:
        from caseledger.server.published import write_published  # lazy: mcp, the tools

        _source_checkout()
        paths += [*write_schemas(PACKAGED_SCHEMAS), write_published()]
    _print({"written": [str(p) for p in paths]}, "\n".join(str(p) for p in paths), a.json)
    return 0


def _source_checkout() -> None:
    """Refuse to write into an installed package: --package regenerates the files of a source checkout only."""
    root = Path(__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    if not (project.is_file() and 'name = "caseledger"' in project.read_text(errors="replace")):
        raise CaseledgerError(
            f"--package regenerates the package's files in a source checkout; {root} is an installation",
            "run it from a clone of caseledger (pip install -e .), or drop --package; nothing was written",
        )


def _init(ws: Workspace, a: argparse.Namespace) -> int:
    from caseledger.init import init_workspace  # lazy: the case models, see _dispatch

    if a.dir is not None and a.workspace is not None and Path(a.dir).resolve() != ws.root:
        raise CaseledgerError(
            f"DIR '{a.dir}' and --workspace '{a.workspace}' name two workspaces",
            "give one of them (caseledger init DIR --engine ...); nothing was written",
        )
    _emit(init_workspace(a.dir if a.dir is not None else ws.root, a.engine), a.json)
    return 0


_COMMANDS: dict[str, Callable[[Workspace, argparse.Namespace], int]] = {
    "freeze": _freeze,
    "run": _run,
    "status": _status,
    "resume": _resume,
    "reprocess": _reprocess,
    "summarize": _summarize,
    "report": _report,
    "authorize": _authorize,
    "handoff": _handoff,
    "index": _index,
    "mcp": _mcp,
    "inspect": _inspect,
    "target": _target,
    "import": _import,
    "demo": _demo,
    "schema": _schema,
    "init": _init,
}


if __name__ == "__main__":
    raise SystemExit(main())
