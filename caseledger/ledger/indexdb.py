"""The index's database: ledger/index.sqlite (stdlib sqlite3, WAL), its schema, and the one write a writer of run
files makes into it (`touched`: the run's generation goes up, so the next reader folds it again).

The index is derived: every row can be rebuilt from the files (caseledger/ledger/index.py does it), and any
problem with the database (missing, damaged, another schema, a read-only ledger) makes it be rebuilt or read
around, never an error of the call. Schema:

    meta(key, value)             schema version; the runs directory's mtime when last listed; last full sweep
    runs(run_id, ...)            one row per run: run.json's fields the reads filter on, the folded state and the
                                 generation it was folded at (gen > folded_gen: a writer changed the run since)
    damaged(entry, message)      ledger/runs entries that are not readable runs, each named
    cases(case_id, scenario, sig) frozen cases: their scenario, by file size and mtime
    derived(kind, key, sig, body) higher stages' figures (a run's latest result, a scenario view) under the
                                 signature of their inputs
    notes(id, utc, text)         disagreements between the index and the files, repaired from the files
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path

SCHEMA_VERSION = "1"
INDEX_FILE = "index.sqlite"
BUSY_MS = 5000  # another process writing the index: wait this long, then read around it

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs(
  run_id TEXT PRIMARY KEY, case_id TEXT NOT NULL, scenario TEXT NOT NULL, parent_case TEXT, target_key TEXT,
  created_utc TEXT NOT NULL, sig TEXT, gen INTEGER NOT NULL DEFAULT 1, folded_gen INTEGER NOT NULL DEFAULT 0,
  live INTEGER NOT NULL DEFAULT 1, state TEXT, failure_class TEXT, current TEXT, decision TEXT, blocker TEXT,
  next_call TEXT, last_done TEXT);
CREATE INDEX IF NOT EXISTS runs_order ON runs(created_utc, run_id);
CREATE INDEX IF NOT EXISTS runs_case ON runs(case_id, created_utc);
CREATE INDEX IF NOT EXISTS runs_scenario ON runs(scenario, created_utc);
CREATE INDEX IF NOT EXISTS runs_stale ON runs(live, gen, folded_gen);
CREATE INDEX IF NOT EXISTS runs_todo ON runs(run_id) WHERE live=1 OR gen != folded_gen;
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE TABLE IF NOT EXISTS damaged(entry TEXT PRIMARY KEY, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cases(case_id TEXT PRIMARY KEY, scenario TEXT, sig TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS derived(kind TEXT NOT NULL, key TEXT NOT NULL, sig TEXT NOT NULL, body BLOB NOT NULL,
  PRIMARY KEY(kind, key));
CREATE TABLE IF NOT EXISTS notes(id INTEGER PRIMARY KEY AUTOINCREMENT, utc TEXT NOT NULL, text TEXT NOT NULL);
"""


TABLES = {"meta", "runs", "damaged", "cases", "derived", "notes"}


def path_of(ledger_dir: Path) -> Path:
    return ledger_dir / INDEX_FILE


def connect(path: Path, *, create: bool) -> sqlite3.Connection | None:
    """A connection in WAL mode with the schema in place, or None: no index there (and create is false), or one
    that cannot be opened. A file of another schema version or not a database raises sqlite3.DatabaseError (the
    caller rebuilds it)."""
    if not create and not path.exists():
        return None
    try:
        conn = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None, check_same_thread=False)
    except sqlite3.Error:
        return None
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # derived data: a lost last commit is rebuilt from the files
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" in tables and (lost := TABLES - tables):  # never recreated empty under a meta that trusts it
            raise sqlite3.DatabaseError(f"index lost its table(s) {', '.join(sorted(lost))}")
        conn.executescript(SCHEMA)
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            conn.execute("INSERT OR IGNORE INTO meta VALUES('schema', ?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"index schema {row[0]}, this version reads {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


KEEP = 4  # open connections kept per thread (a process reads one workspace, a test process many)
_FileKey = tuple[int, int, int, int, int, int]


class _Kept(threading.local):
    """This thread's open connections, by index path, with the file's identity when last used."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.conns: OrderedDict[str, tuple[_FileKey | None, sqlite3.Connection]] = OrderedDict()
        self.busy: set[str] = set()  # kept connections handed out and not released yet (an open Index)


_kept = _Kept()


def _file_key(path: Path) -> _FileKey | None:
    """The index file's identity and its WAL's size and mtime: another process's commit changes the WAL, and is
    a reason to check the file again (connect: its schema, its tables)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        wal = os.stat(str(path) + "-wal")
        w = (wal.st_size, wal.st_mtime_ns)
    except OSError:
        w = (-1, -1)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, *w)


def shared(path: Path, *, create: bool) -> sqlite3.Connection | None:
    """connect(), kept open for this thread's next call: closing the last connection checkpoints the WAL (a few ms
    with an fsync), which a controller refreshing HANDOFF.md before every phase would pay each time. Kept only
    while the file is as this thread left it (same inode, size and mtime, WAL included): a file replaced, removed,
    written by hand or by another process is opened again (and checked again by connect)."""
    if _kept.pid != os.getpid():  # a forked child: its parent's connections are not its own
        _kept.pid, _kept.conns, _kept.busy = os.getpid(), OrderedDict(), set()
    if str(path) in _kept.busy:  # nested (an Index open in this thread already): a connection of its own
        return connect(path, create=create)
    hit = _kept.conns.get(str(path))
    if hit is not None:
        if hit[0] is not None and hit[0] == _file_key(path):
            _kept.conns.move_to_end(str(path))
            _kept.busy.add(str(path))
            return hit[1]
        forget(path)
    conn = connect(path, create=create)
    if conn is None:
        return None
    _kept.conns[str(path)] = (_file_key(path), conn)
    _kept.busy.add(str(path))
    while len(_kept.conns) > KEEP:
        _, (_, old) = _kept.conns.popitem(last=False)
        old.close()
    return conn


def release(path: Path, conn: sqlite3.Connection) -> None:
    """Done with a shared connection for now: remember the file as this connection left it (its own writes and
    checkpoints change the file's mtime; those are no reason to open it again)."""
    hit = _kept.conns.get(str(path))
    if hit is not None and hit[1] is conn:
        _kept.busy.discard(str(path))
        if conn.in_transaction:  # an error left a transaction open: never carried into the next call
            forget(path)
            return
        _kept.conns[str(path)] = (_file_key(path), conn)
    else:
        conn.close()


def forget(path: Path, conn: sqlite3.Connection | None = None) -> None:
    """Close and drop this thread's kept connection to `path` (the file is damaged or about to be replaced); with
    conn: only when conn is that kept connection (else conn alone is closed: a nested Index's own)."""
    hit = _kept.conns.get(str(path))
    if conn is not None and (hit is None or hit[1] is not conn):
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        return
    hit = _kept.conns.pop(str(path), None)
    _kept.busy.discard(str(path))
    if hit is not None:
        with contextlib.suppress(sqlite3.Error):
            hit[1].close()


def disk_full(e: sqlite3.Error) -> bool:
    """SQLite's 'database or disk is full'."""
    return getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def touched(run_root: Path) -> None:
    """A writer changed files of the run in `run_root` (an event appended, run.json written): the run's
    generation goes up, so the next reader folds it again. Only runs under ledger/runs; never creates the index,
    never fails the writer (a stale or missing row is repaired by the next reader, from the files)."""
    if run_root.parent.name != "runs":
        return  # a preflight-only check (ledger/preflights), not a run
    path = path_of(run_root.parent.parent)
    if not path.exists():
        return
    try:
        conn = shared(path, create=False)
        if conn is not None:
            conn.execute("UPDATE runs SET gen = gen + 1 WHERE run_id = ?", (run_root.name,))
            release(path, conn)
    except sqlite3.OperationalError as e:
        if not disk_full(e):
            forget(path)
        # a full disk: the connection is kept (closing it would delete the WAL and free disk under whoever is
        # recording why the disk is full); the row's generation is repaired by the next reader, from the files
    except (sqlite3.Error, OSError):
        forget(path)
