"""The derived index of the ledger (ledger/index.sqlite): runs with their folded state, damaged entries, frozen
cases by scenario, and the figures higher stages derive from them, so a read at 10,000 runs does not fold
10,000 runs. The files stay the truth; the index only remembers what was read from them.

How it stays true, cheaply (the design of issue 25):
- A writer of run state (append_event, write_meta) bumps the run's generation (`indexdb.touched`): the next
  reader folds that run again. A run added or removed changes ledger/runs' mtime: the next reader lists it
  (an mtime younger than a second is not trusted: a run created in the same tick is listed again next time).
- A run whose state depends on live processes (running, created, a controller or client alive, a failed run
  whose service is ours to check) is folded again at every read: its evidence can change without a write.
- Every read (but the controller's quick refresh) compares a slice of rows with their files (events.jsonl size
  and mtime, the run directory's mtime), round robin: a file edited by hand is found within a few reads; the
  row is repaired from the files and the disagreement noted (`caseledger index` shows the notes).
- A missing index is rebuilt; a damaged one (not a database, another schema) is moved aside and rebuilt; a
  read-only ledger gets an index in memory for the call. `caseledger index --rebuild` rebuilds by hand.
Readers write only this derived file, never run state, reports or charts (issue 57), and only what differs from the
files: a row whose run changed since the index last read it (a writer's event, a controller that has exited since,
a hand edit), a figure computed for the first time. Nothing else is rewritten, so a read of a ledger the index is in
step with writes nothing at all (tests/test_fault_minors.py). Folding what changed is needed for a true answer; keeping
the fold is what lets the next read skip it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from caseledger.errors import CaseInvalid, CaseledgerError, NotFound, quoted
from caseledger.ledger import indexdb
from caseledger.ledger.runs import CREATING_S, Run, read_meta
from caseledger.ledger.state import RunState, RunView, fold
from caseledger.workspace import RunPaths, Workspace, is_id, utc_now

SWEEP_ROWS = 400  # rows compared with their files per read (round robin)
RACY_S = 1.0  # a directory mtime this young may hide a change made in the same tick: not trusted
MAX_NOTES = 200  # notes kept (the oldest are dropped)


@dataclass(frozen=True)
class RunRow:
    """One run as the index knows it: run.json's fields the reads filter on and its folded state."""

    run_id: str
    case_id: str
    scenario: str
    parent_case: str | None
    target_key: str | None
    created_utc: str
    state: str | None  # RunState value (None: could not be folded, see damaged)
    failure_class: str | None
    current: str | None
    decision: str | None  # the decision's outcome recorded by the run (decision.json)
    blocker: str | None
    next_call: str | None
    last_done: str | None  # the last phase that ran to done
    live: bool  # its state depends on live processes: folded again at every read
    sig: str | None  # events.jsonl size:mtime and the run directory's mtime when it was folded


_COLS = (
    "run_id, case_id, scenario, parent_case, target_key, created_utc, state, failure_class, current, "
    "decision, blocker, next_call, last_done, live, sig"
)


def _row(t: tuple[object, ...]) -> RunRow:
    return RunRow(*t[:13], bool(t[13]), t[14])  # type: ignore[arg-type, call-arg]


def signature(root: Path) -> str:
    """What changes when a run's files change: events.jsonl's size and mtime, the run directory's mtime (an
    atomic write of run.json, decision.json or controller.pid renames into it)."""
    try:
        ev = os.stat(root / "events.jsonl")
        evs = f"{ev.st_size}:{ev.st_mtime_ns}"
    except FileNotFoundError:
        evs = "-"
    try:
        return f"{evs}:{os.stat(root).st_mtime_ns}"
    except FileNotFoundError:
        return f"{evs}:-"


def is_live(v: RunView) -> bool:
    """A state that can change without a write to the run's files."""
    if v.state in (RunState.RUNNING, RunState.CREATED) or v.controller_alive or v.client_alive:
        return True
    return v.state not in (RunState.SUCCEEDED, RunState.PARTIAL) and v.service_alive is not None


def row_of(v: RunView, sig: str | None = None) -> RunRow:
    """The index's row of a folded run."""
    done = [p for p, ph in v.phases.items() if ph.state.value == "done"]
    m = v.meta
    return RunRow(
        run_id=v.run_id,
        case_id=m.case_id,
        scenario=m.scenario,
        parent_case=m.parent_case,
        target_key=m.target_key,
        created_utc=m.created_utc,
        state=v.state.value,
        failure_class=v.failure_class.value if v.failure_class else None,
        current=v.current.value if v.current else None,
        decision=v.decision.outcome if v.decision else None,
        blocker=v.blocker,
        next_call=v.next_call,
        last_done=done[-1].value if done else None,
        live=is_live(v),
        sig=sig,
    )


class Index:
    """An open index of one workspace, in step with its files as of `sync`. Use as a context manager."""

    def __init__(self, ws: Workspace, conn: sqlite3.Connection, persistent: bool, kept: Path | None = None) -> None:
        self.ws = ws
        self.conn = conn
        self.persistent = persistent
        self.kept = kept  # the index file whose connection this thread keeps open (indexdb.shared)
        self.views: dict[str, RunView] = {}  # the runs folded by this sync (reads reuse them)

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kept is not None:
            indexdb.release(self.kept, self.conn)
        else:
            self.conn.close()

    # ---------------------------------------------------------------------------------------------- keeping up
    def _meta(self, key: str) -> str | None:
        r = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return str(r[0]) if r else None

    def _set_meta(self, key: str, value: str) -> None:
        if self._meta(key) == value:  # a read in step writes nothing
            return
        self.conn.execute(
            "INSERT INTO meta VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value)
        )

    def _damaged(self, name: str, message: str) -> None:
        """`name` is no readable run: its row goes, its message is kept (rewritten only when it changed)."""
        self._forget(name)
        had = self.conn.execute("SELECT message FROM damaged WHERE entry=?", (name,)).fetchone()
        if had is None or had[0] != message:
            self.conn.execute("INSERT OR REPLACE INTO damaged VALUES(?, ?)", (name, message))

    def note(self, text: str) -> None:
        self.conn.execute("INSERT INTO notes(utc, text) VALUES(?, ?)", (utc_now(), text))
        self.conn.execute("DELETE FROM notes WHERE id <= (SELECT MAX(id) FROM notes) - ?", (MAX_NOTES,))

    def _fold_entry(self, name: str, gen: int | None) -> None:
        """Read and fold the run directory `name` into its row (or the damaged table)."""
        root = self.ws.runs_dir / name
        if root.is_symlink() or not root.is_dir() or not is_id(name, "r"):
            what = (
                "is a symbolic link, not a run directory (not followed)"
                if root.is_symlink()
                else "is not a run directory"
            )
            self._damaged(name, f"ledger/runs/{quoted(name, 40)} {what}")
            return
        before = signature(root)
        try:
            meta = read_meta(RunPaths(root))
            view = fold(self.ws, Run(paths=RunPaths(root), meta=meta, workspace=self.ws))
        except CaseInvalid as e:
            self._damaged(name, e.message)
            return
        except NotFound:
            young = time.time() - root.stat().st_mtime <= CREATING_S  # create_run is writing run.json
            self._damaged(name, "" if young else f"ledger/runs/{name} has no run.json")
            return
        except CaseledgerError as e:  # any other problem of its files: named, the other runs shown
            self._damaged(name, e.message)
            return
        self.conn.execute("DELETE FROM damaged WHERE entry=?", (name,))
        self.views[name] = view
        r = row_of(view, before)
        changed = signature(root) != before  # written to while folding: folded again next time
        g = gen if gen is not None else 1
        values = (
            r.run_id,
            r.case_id,
            r.scenario,
            r.parent_case,
            r.target_key,
            r.created_utc,
            r.state,
            r.failure_class,
            r.current,
            r.decision,
            r.blocker,
            r.next_call,
            r.last_done,
            int(r.live or changed),
            r.sig,
        )
        had = self.conn.execute(f"SELECT {_COLS}, folded_gen FROM runs WHERE run_id=?", (name,)).fetchone()
        if had is not None and tuple(had) == (*values, g - 1 if changed else g):
            return  # the row as it was (a live run that did not move): a read in step writes nothing
        self.conn.execute(
            f"INSERT INTO runs({_COLS}, gen, folded_gen) VALUES({','.join('?' * 17)}) ON CONFLICT(run_id) DO UPDATE "
            "SET " + ", ".join(f"{c}=excluded.{c}" for c in _COLS.split(", ")[1:]) + ", folded_gen=excluded.folded_gen",
            (*values, g, g - 1 if changed else g),
        )

    def _forget(self, name: str) -> None:
        self.conn.execute("DELETE FROM runs WHERE run_id=?", (name,))

    def sync(self, *, quick: bool = False) -> Index:
        """Bring the index in step with the files (see the module's docstring); quick: no sweep of settled rows
        (the controller's refresh before each phase: its own writes are in through `touched`)."""
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            self._list_runs()
            for (name,) in c.execute("SELECT entry FROM damaged").fetchall():  # fixed by hand? being created?
                if name not in self.views:
                    self._fold_entry(name, None)
            stale = c.execute(
                "SELECT run_id, gen FROM runs INDEXED BY runs_todo "  # the partial index: no scan
                "WHERE live=1 OR gen != folded_gen"
            ).fetchall()
            for name, gen in stale:
                if name not in self.views:  # (a run just listed is folded already)
                    self._fold_entry(name, gen)
            if not quick:
                self._sweep()
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return self

    def _list_runs(self) -> None:
        d = self.ws.runs_dir
        try:
            mtime = os.stat(d).st_mtime_ns
        except FileNotFoundError:
            self.conn.execute("DELETE FROM runs")
            self.conn.execute("DELETE FROM damaged")
            return
        if self._meta("runs_mtime") == str(mtime):
            return
        names = {e.name for e in os.scandir(d)}
        known = {r[0] for r in self.conn.execute("SELECT run_id FROM runs UNION SELECT entry FROM damaged")}
        for name in known - names:
            self._forget(name)
            self.conn.execute("DELETE FROM damaged WHERE entry=?", (name,))
        for name in sorted(names - known):
            self._fold_entry(name, None)
        young = time.time_ns() - mtime < RACY_S * 1e9
        self._set_meta("runs_mtime", "" if young else str(mtime))

    def _sweep(self) -> None:
        """Compare the next SWEEP_ROWS settled rows with their files; a difference nobody announced (a hand edit,
        a writer that crashed between its file and the index, an older caseledger) is repaired and noted."""
        at = self._meta("sweep_at") or ""
        rows = self.conn.execute(
            "SELECT run_id, sig, gen FROM runs WHERE run_id > ? ORDER BY run_id LIMIT ?", (at, SWEEP_ROWS)
        ).fetchall()
        for name, sig, gen in rows:
            now = signature(self.ws.runs_dir / name)
            if now != sig:
                self.note(
                    f"ledger/runs/{name} changed without the index knowing (its files say otherwise): "
                    "repaired from the files"
                )
                self._fold_entry(name, gen)
        self._set_meta("sweep_at", rows[-1][0] if len(rows) == SWEEP_ROWS else "")

    # -------------------------------------------------------------------------------------------------- reads
    def _select(
        self, where: str = "", args: tuple[object, ...] = (), order: str = "ASC", limit: int | None = None
    ) -> list[RunRow]:
        q = f"SELECT {_COLS} FROM runs {where} ORDER BY created_utc {order}, run_id {order}"
        if limit is not None:
            q += f" LIMIT {int(limit)}"
        return [_row(t) for t in self.conn.execute(q, args)]

    def latest(self) -> RunRow | None:
        rows = self._select(order="DESC", limit=1)
        return rows[0] if rows else None

    def recent(self, n: int) -> list[RunRow]:
        """The n newest runs, oldest first."""
        return self._select(order="DESC", limit=n)[::-1]

    def runs(self, *, case_ids: list[str] | None = None, scenario: str | None = None) -> list[RunRow]:
        """Runs of these cases or of this scenario, oldest first."""
        if case_ids is not None:
            marks = ",".join("?" * len(case_ids))
            return self._select(f"WHERE case_id IN ({marks})", tuple(case_ids)) if case_ids else []
        if scenario is not None:
            return self._select("WHERE scenario=?", (scenario,))
        return self._select()

    def digest(self, case_ids: list[str]) -> list[tuple[str, str | None, str | None, str | None, bool]]:
        """(run_id, state, decision, sig, live) of the runs of these cases, oldest first: what a derived view's
        signature needs, without building rows."""
        if not case_ids:
            return []
        marks = ",".join("?" * len(case_ids))
        q = (
            f"SELECT run_id, state, decision, sig, live FROM runs WHERE case_id IN ({marks}) "
            "ORDER BY created_utc, run_id"
        )
        return [(str(a), b, c, d, bool(e)) for a, b, c, d, e in self.conn.execute(q, tuple(case_ids))]

    def rows(self, run_ids: list[str]) -> list[RunRow]:
        """These runs' rows (those the index has), oldest first."""
        if not run_ids:
            return []
        return self._select(f"WHERE run_id IN ({','.join('?' * len(run_ids))})", tuple(run_ids))

    def of_case(self, case_id: str) -> Iterator[RunRow]:
        """The runs of a case, newest first."""
        yield from self._select("WHERE case_id=?", (case_id,), order="DESC")

    def active(self, since_utc: str) -> list[RunRow]:
        """Per scenario its newest run, for the scenarios with a run created since `since_utc` or one whose state
        is running or created; newest first."""
        names = [
            s
            for (s,) in self.conn.execute(  # a range on runs_order, then the few unfinished runs
                "SELECT scenario FROM runs WHERE created_utc >= ? UNION SELECT scenario FROM runs WHERE state IN "
                "('running', 'created')",
                (since_utc,),
            )
        ]
        newest = (self._select("WHERE scenario=?", (s,), order="DESC", limit=1) for s in names)
        return sorted((rows[0] for rows in newest if rows), key=lambda r: (r.created_utc, r.run_id), reverse=True)

    def damaged(self) -> list[str]:
        return [str(m) for (m,) in self.conn.execute("SELECT message FROM damaged WHERE message != '' ORDER BY entry")]

    def notes(self) -> list[tuple[str, str]]:
        return [(str(u), str(t)) for u, t in self.conn.execute("SELECT utc, text FROM notes ORDER BY id")]

    def count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])

    # ------------------------------------------------------------------------------------- derived by others
    def derived(self, kind: str, key: str, sig: str) -> bytes | None:
        """What a higher stage stored for (kind, key) when its inputs had signature `sig`; None otherwise."""
        r = self.conn.execute("SELECT sig, body FROM derived WHERE kind=? AND key=?", (kind, key)).fetchone()
        return bytes(r[1]) if r is not None and r[0] == sig else None

    def put_derived(self, kind: str, key: str, sig: str, body: bytes) -> None:
        with contextlib.suppress(sqlite3.OperationalError):  # busy or read-only: computed again next time
            self.conn.execute(
                "INSERT INTO derived VALUES(?,?,?,?) ON CONFLICT(kind, key) DO UPDATE SET "
                "sig=excluded.sig, body=excluded.body",
                (kind, key, sig, body),
            )

    def cases(self) -> dict[str, str | None]:
        """case id -> scenario of every frozen case (ledger/cases/c-*.json), kept in step by file size and mtime."""
        d = self.ws.frozen_dir
        found: dict[str, str] = {}
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(d):
                if e.name.startswith("c-") and e.name.endswith(".json"):
                    st = e.stat()
                    found[e.name[:-5]] = f"{st.st_size}:{st.st_mtime_ns}"
        known = {str(k): (s, sig) for k, s, sig in self.conn.execute("SELECT case_id, scenario, sig FROM cases")}
        out: dict[str, str | None] = {}
        for cid, sig in found.items():
            if cid in known and known[cid][1] == sig:
                out[cid] = known[cid][0]
                continue
            try:
                scenario = orjson.loads((d / f"{cid}.json").read_bytes()).get("scenario")
            except (OSError, ValueError, AttributeError):
                scenario = None  # damaged: the reads that load it name it
            out[cid] = scenario if isinstance(scenario, str) else None
            with contextlib.suppress(sqlite3.OperationalError):
                self.conn.execute(
                    "INSERT INTO cases VALUES(?,?,?) ON CONFLICT(case_id) DO UPDATE SET "
                    "scenario=excluded.scenario, sig=excluded.sig",
                    (cid, out[cid], sig),
                )
        for cid in set(known) - set(found):
            with contextlib.suppress(sqlite3.OperationalError):
                self.conn.execute("DELETE FROM cases WHERE case_id=?", (cid,))
        return out


def _aside(path: Path) -> None:
    """Move a damaged index out of the way (kept for a look, never read again), with its WAL files."""
    indexdb.forget(path)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(path) + suffix)
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, str(path) + ".damaged")


def writable(ledger: Path) -> bool:
    """The ledger directory can hold the index file."""
    return ledger.is_dir() and os.access(ledger, os.W_OK)


def open_index(ws: Workspace, *, quick: bool = False, rebuild: bool = False) -> Index:
    """The workspace's index, in step with its files (rebuilt when missing, damaged or asked to)."""
    path = indexdb.path_of(ws.ledger)
    why = "asked to rebuild" if rebuild else None
    if rebuild:
        _aside(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(path) + ".damaged")
    conn: sqlite3.Connection | None = None
    persistent = writable(ws.ledger)
    if persistent:
        try:
            conn = indexdb.shared(path, create=True)
        except sqlite3.DatabaseError as e:
            _aside(path)
            why = f"the index was damaged ({quoted(e, 120)}): moved to {path.name}.damaged and rebuilt"
            with contextlib.suppress(sqlite3.DatabaseError):
                conn = indexdb.shared(path, create=True)
    if conn is None:  # a read-only ledger (or one that cannot hold the file): an index for this call only
        persistent = False
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        conn.executescript(indexdb.SCHEMA)
    idx = Index(ws, conn, persistent, path if persistent else None)
    try:
        try:
            idx.sync(quick=quick)
        except sqlite3.DatabaseError as e:  # damaged inside (a page, a table): rebuilt from the files
            if isinstance(e, sqlite3.OperationalError):
                raise  # locked, read-only or a full disk: not damage (below)
            _aside(path)
            conn.close()
            conn = indexdb.connect(path, create=True) or sqlite3.connect(":memory:", isolation_level=None)
            conn.executescript(indexdb.SCHEMA)
            idx = Index(ws, conn, persistent)
            idx.sync(quick=quick)
            why = f"the index was damaged ({quoted(e, 120)}): rebuilt from the files"
        if why is not None:
            idx.conn.execute("BEGIN IMMEDIATE")
            idx.note(why)
            idx.conn.execute("COMMIT")
    except sqlite3.OperationalError as e:
        # locked past the busy timeout, read-only after all, or a full disk: this call reads the files into memory
        if idx.kept is not None and indexdb.disk_full(e):
            # kept open, its transaction undone: closing it would delete the WAL and free disk under whoever is
            # recording why the disk is full
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
        elif idx.kept is not None:
            indexdb.forget(idx.kept, conn)
        else:
            conn.close()
        mem = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        mem.executescript(indexdb.SCHEMA)
        idx = Index(ws, mem, False).sync(quick=True)
    return idx
