"""The workspace: where drafts, the ledger and HANDOFF.md live (layout), and how files in it are written (files).

Layout (everything the tool writes is under ledger/):
    cases/                     drafts written by people or agents
    HANDOFF.md                 generated snapshot, never authoritative
    ledger/cases/<case_id>.json            frozen cases, read-only
    ledger/datasets/<dataset_id>/          materialized datasets (entries.jsonl, identity.json)
    ledger/runs/<run_id>/                  one directory per run (see RunPaths)
    (target leases are host-wide, in $CASELEDGER_HOST_DIR: see ledger/leases.py)
    ledger/services/<target_key>.json      the live service started by caseledger on that target
    ledger/authorization.json              paused | single | auto
"""

from caseledger.workspace.files import (
    ENV_LOCK_TIMEOUT,
    LOCK_TIMEOUT_S,
    Spare,
    atomic_write,
    canonical_json,
    flocked,
    is_disk_full,
    lock_fd,
    lock_timeout,
    read_json,
    read_json_or_none,
    read_ref,
    reserve,
    sha256_bytes,
    sha256_file,
    utc_from_epoch,
    utc_now,
    write_json,
)
from caseledger.workspace.layout import (
    ENV_WORKSPACE,
    MAX_PATH_CHARS,
    RESULT_FILE,
    PartPaths,
    RunPaths,
    Workspace,
    check_id,
    exists,
    is_id,
    read_file_field,
    resolve_path,
)

__all__ = [
    "ENV_LOCK_TIMEOUT",
    "ENV_WORKSPACE",
    "LOCK_TIMEOUT_S",
    "MAX_PATH_CHARS",
    "RESULT_FILE",
    "PartPaths",
    "RunPaths",
    "Spare",
    "Workspace",
    "atomic_write",
    "canonical_json",
    "check_id",
    "exists",
    "flocked",
    "is_disk_full",
    "is_id",
    "lock_fd",
    "lock_timeout",
    "read_file_field",
    "read_json",
    "read_json_or_none",
    "read_ref",
    "reserve",
    "resolve_path",
    "sha256_bytes",
    "sha256_file",
    "utc_from_epoch",
    "utc_now",
    "write_json",
]
