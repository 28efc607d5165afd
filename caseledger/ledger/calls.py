"""Every tool call an answer names, written here once (pure: no I/O).

An answer (phase_status, summarize, the campaign and scenario views, HANDOFF.md, an error's fix) ends with the
one call to make next, as text an agent can copy: `resume(run_id='r-1')`. The forms (one function per tool
call form: `resume`, `start_run`, ...) write that text; the situations (`campaign_answer`, `repair_figures`,
...) are the next call where several views tell the same situation, so they say it in the same words;
`as_cli` turns the same forms into the commands a person types at a shell. A module elsewhere never writes a
call's text itself (tests/test_quality.py fails when one does).

An argument given as `...` is the placeholder a caller fills in: `start_run(...)` -> "start_run(case_id=...)".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from types import EllipsisType

Arg = str | EllipsisType  # a value, or ... for the placeholder the caller fills in

MAX_WAIT_S = 600.0  # the bound of phase_status's wait, and the wait every "next" names (clients time out later)


def _v(value: Arg) -> str:
    return "..." if value is ... else f"'{value}'"


# -- the forms: one per tool call an answer names ------------------------------------------------------------


def freeze_case(path: Arg = ..., parent: str | None = None) -> str:
    """`freeze_case(path='cases/x.json', parent='c-1')`: freeze a draft file (a child of parent)."""
    return f"freeze_case(path={_v(path)}" + (f", parent='{parent}'" if parent else "") + ")"


def freeze_draft(what: str, parent: str | None = None) -> str:
    """`freeze_case(next candidate, parent='c-1')`: freeze a draft the caller writes, said in words; a parent
    in <angle brackets> is said in words too."""
    said = (parent if parent.startswith("<") else f"'{parent}'") if parent else None
    return f"freeze_case({what}" + (f", parent={said}" if said else "") + ")"


def start_run(case_id: Arg, *, preflight_only: bool = False) -> str:
    """`start_run(case_id='c-1')`: run a case (a campaign's id: start its driver); preflight_only checks it."""
    return f"start_run(case_id={_v(case_id)}" + (", preflight_only=True" if preflight_only else "") + ")"


def phase_status(run_id: Arg | None = None, wait_s: float | None = None) -> str:
    """`phase_status(run_id='r-1', wait_s=600)`: where a run (or campaign) stands; no run_id: the latest run."""
    args = [f"run_id={_v(run_id)}"] if run_id is not None else []
    args += [f"wait_s={wait_s:g}"] if wait_s is not None else []
    return f"phase_status({', '.join(args)})"


def resume(run_id: Arg) -> str:
    """`resume(run_id='r-1')`: go on from the failed phase."""
    return f"resume(run_id={_v(run_id)})"


def reprocess_raw(run_id: Arg) -> str:
    """`reprocess_raw(run_id='r-1')`: compute the figures again from the raw data."""
    return f"reprocess_raw(run_id={_v(run_id)})"


def summarize(run_ids: Sequence[str] | EllipsisType | None = None, scenario: Arg | None = None) -> str:
    """`summarize(run_ids=['r-1'])`, `summarize(scenario='s')`, or `summarize()` (the latest scenario)."""
    if run_ids is not None:
        ids = "..." if run_ids is ... else ", ".join(f"'{r}'" for r in run_ids)
        return f"summarize(run_ids=[{ids}])"
    return f"summarize(scenario={_v(scenario)})" if scenario is not None else "summarize()"


# -- the situations: the next call several views tell ---------------------------------------------------------


def wait(run_id: str) -> str:
    """A run or a campaign going on: wait until it ends or needs the caller (every "next" names this wait)."""
    return f"{phase_status(run_id, MAX_WAIT_S)}: answers when it ends or needs you"


def run_succeeded(run_id: str, parent: str | None = None) -> str:
    """A run measured to its end: summarize it (parent: then freeze the next candidate as its child)."""
    return summarize([run_id]) + (f" then freeze the next candidate with parent {parent}" if parent else "")


def first_case() -> str:
    """A workspace with no case or no run yet: freeze a draft, then run it."""
    return f"{freeze_case('cases/x.json')} then {start_run(...)}"


def repair_figures(run_id: str) -> str:
    """The load ended but its figures failed (postprocess, collect): compute them again from the raw data."""
    return f"{reprocess_raw(run_id)} — repairs from raw data, no requests re-sent"


def campaign_answer(campaign_id: str) -> str:
    """A campaign's point (a run of it, or the latest run): the answer is the campaign's."""
    return f"{summarize([campaign_id])}: the campaign's answer (its points are not decided one by one)"


def continue_campaign(campaign_id: str) -> str:
    """A campaign stopped with points left (its driver gone): starting it again continues it."""
    return f"{start_run(campaign_id)}: the campaign stopped with points left; this continues it"


def next_candidate(parent: str | None) -> str:
    """A change decided (kept, or a baseline): freeze the next candidate as a child of parent (None: of the
    scenario's baseline, no case being kept yet)."""
    return freeze_draft("next candidate", parent or "<the scenario's baseline>")


def repeat(case_id: str, why: str) -> str:
    """A case measured again, and why ('a repeat settles a change within the noise')."""
    return f"{start_run(case_id)} again: {why}"


def repeat_on_quiet_host(case_id: str, why: str | None = None) -> str:
    """A distorted window (a stalled client, a contended host) is repeated on a quiet host, never decided on."""
    return f"{start_run(case_id)} again on a quiet host: " + (
        why or "a distorted window (a stalled client, a contended host) is repeated, never decided on"
    )


def resume_when_link_back(run_id: str) -> str:
    """A load host's link is down mid-load: resume re-attaches over SSH once it is back."""
    return f"{resume(run_id)} once the link is back"


# -- the same forms at a shell -------------------------------------------------------------------------------


def _value(name: str) -> str:
    """The pattern of a value as the forms write it: quoted, or ... (the placeholder, at a shell <name>)."""
    return rf"(?P<{name}>'[^']+'|\.\.\.)"


# each form above -> the CLI command that does the same (`as_cli`), most specific first
_AS_CLI: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (
            rf"freeze_case\(path={_value('path')}, parent={_value('parent')}\)",
            "caseledger freeze {path} --parent {parent}",
        ),
        (rf"freeze_case\(path={_value('path')}\)", "caseledger freeze {path}"),
        (
            rf"start_run\(case_id={_value('case_id')}, preflight_only=True\)",
            "caseledger run {case_id} --preflight-only",
        ),
        (rf"start_run\(case_id={_value('case_id')}\)", "caseledger run {case_id} --wait"),
        (
            rf"phase_status\(run_id={_value('run_id')}, wait_s=(?P<wait_s>\d+)\)",
            "caseledger status {run_id} --wait {wait_s}",
        ),
        (rf"phase_status\(run_id={_value('run_id')}\)", "caseledger status {run_id}"),
        (r"phase_status\(\)", "caseledger status"),
        (rf"resume\(run_id={_value('run_id')}\)", "caseledger resume {run_id} --wait"),
        (rf"reprocess_raw\(run_id={_value('run_id')}\)", "caseledger reprocess {run_id}"),
        (rf"summarize\(scenario={_value('scenario')}\)", "caseledger summarize --scenario {scenario}"),
        (r"summarize\(run_ids=\[(?P<run_ids>[^\]]*)\]\)", "caseledger summarize {run_ids}"),
        (r"summarize\(\)", "caseledger summarize"),
    )
)


def _word(name: str, value: str) -> str:
    """A value of a form in the words of a shell: unquoted; the placeholder as <name> ('<run_id> ...')."""
    if name == "run_ids":
        return " ".join(re.findall(r"'([^']+)'", value)) or "<run_id> ..."
    return f"<{name}>" if value == "..." else value.strip("'")


def _command(template: str, m: re.Match[str]) -> str:
    return template.format(**{k: _word(k, v) for k, v in m.groupdict().items()})


def as_cli(text: str) -> str:
    """An answer's tool calls in the words of the CLI ('start_run(case_id='c-1')' -> 'caseledger run c-1 --wait'):
    a person at a shell gets commands, an agent over MCP the tool calls; one table, every answer."""
    for pattern, template in _AS_CLI:
        text = pattern.sub(functools.partial(_command, template), text)
    return text
