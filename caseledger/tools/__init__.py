"""The six tools as plain functions over a workspace (no MCP types here).

Each returns a pydantic model; `.text()` is the short answer (a few lines: the facts and the next call).
"""

from caseledger.tools.campaigns import CampaignFrozen, resume_any, start_any, status_any
from caseledger.tools.freeze_case import FreezeResult, freeze_any, freeze_case
from caseledger.tools.phase_status import StatusResult, phase_status
from caseledger.tools.report import ReportResult, html_report
from caseledger.tools.reprocess_raw import ReprocessResult, reprocess_raw
from caseledger.tools.resume import ResumeResult, resume
from caseledger.tools.start_run import StartResult, start_run
from caseledger.tools.summarize import SummaryResult, summarize

__all__ = [
    "CampaignFrozen",
    "FreezeResult",
    "ReportResult",
    "ReprocessResult",
    "ResumeResult",
    "StartResult",
    "StatusResult",
    "SummaryResult",
    "freeze_any",
    "freeze_case",
    "html_report",
    "phase_status",
    "reprocess_raw",
    "resume",
    "resume_any",
    "start_any",
    "start_run",
    "status_any",
    "summarize",
]
