"""Group commit: the write calls in flight together land as one group.

A writer used from several threads of one process (the appends of a store's sessions, a
LangGraph saver's background saves) hands each call to a :class:`GroupCommit` as a
:class:`Job`. The first caller to find no group being written leads: it stages every call
queued so far, stores all their objects with one :meth:`Plumbing.write_many` (one pack
record, one sync) and moves each ref once (:meth:`Plumbing.swap`, or
:meth:`Plumbing.swap_many` for several refs: on local disk in format 3 their intents share
one sync). The other callers wait and return once their call landed or failed; the next
one leads the calls queued meanwhile. A caller alone pays one lock and one queue.

Staging a call builds its commits onto the :class:`Move` of the ref it extends (calls on
one ref chain, in queue order, onto one batch). A call that lost a compare-and-swap race is
staged again on a fresh read by the same leader, under the retry policy of
:meth:`Plumbing.land`; a call marked ``final`` (an append that named the commit it expects)
fails with the :class:`~castore.errors.RefConflict` instead. One call's failure is its own:
the others of the group land. A failed object write or an interrupted leader fails every
call staged in the group, and no ref moves to their commits.

A write batch (:class:`WriteBatch`, :meth:`castore.Store.batch`) groups the calls of one
thread over a longer span, many sessions at a time (an import): its ref moves are staged in
memory (:class:`~castore.refs.RefStage`; the thread reads them back), and so are the objects
the thread writes (:meth:`~castore.objectstore.ObjectStore.hold_writes`: readable by the
handle, not yet stored). Each landing first writes the held objects, as a few records with one
log append (:meth:`~castore.objectstore.ObjectStore.write_held`), then :func:`land_staged`
lands the refs as groups of :meth:`Plumbing.swap_many`, each a compare-and-swap from the value
the batch first built on: on local disk in format 3 one sync makes the objects and every
intent of the group durable.
A session's HEAD (its info: an importer's position in its file) moves only after the
session's other refs landed, so a lost compare leaves HEAD and its info where they were;
:func:`watch_landings` tells a caller which refs each landing moved (an import that lost a
race counts what its landings stored).
Until a batch lands, no ref names what it wrote: stopped before (kill -9, Ctrl-C), the store
is as the last landed batch left it, and nothing stored before is lost. While a batch is
open its stores' background repack is held (:meth:`~castore.objectstore.ObjectStore.
hold_repack`), and what they write meanwhile is compressed once: each landing writes its
objects as blocks in the repack's final layout, which the repack after the batch copies as they
are, and the logs are sealed less often (docs/FORMAT.md, 12).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from .errors import CastoreError, RefConflict, RefLocked
from .objectstore import ObjectStore
from .plumbing import Batch, Plumbing
from .refs import RefStage, RefValue, Staged, open_stage
from .retry import locked_error

#: seconds, at most, a leader waits for a call that queued calls are ``awaiting`` (one of
#: another thread, in flight: writing the queued calls alone would make it wait for their
#: group, one more write and sync on its path)
LINGER = 0.002


@dataclass(eq=False)
class Job:
    """One call waiting for its group commit.

    Attributes:
        lane: the ref folder the call writes under (a session's prefix); a lost race is
            named by it, and a call that fails to stage sends the calls of its lane staged
            before it to a fresh attempt.
        stage: builds the call's commits into a group (with the writer's lock held); raises
            :class:`~castore.errors.RefConflict` when it lost a race (it is staged again),
            anything else to fail the call.
        final: a lost race fails the call with its conflict instead of staging it again.
        awaited: other calls may be ``awaiting`` this one: its arrival ends a leader's wait.
        awaiting: while it returns True the call belongs with one still in flight, and a
            leader lingers for that one (at most :data:`LINGER` seconds).
        forget: called when what the call staged is dropped (lost or failed), with the ref
            whose value the writer kept is now stale (None: only the staged commits are):
            the writer drops what it cached.
        tries: how many times the call was staged (0 on the first: a retry reads afresh).
        result: what ``stage`` left for the caller (:meth:`GroupCommit.land` returns it).
    """

    lane: str
    stage: Callable[[Group, Job], None]
    final: bool = False
    awaited: bool = False
    awaiting: Callable[[], bool] | None = None
    forget: Callable[[str | None], None] | None = None
    tries: int = 0
    result: Any = None
    conflict: RefConflict | None = None  # the race it lost last
    done: bool = False  # no longer queued: landed, or failed with ``error``
    landed: bool = False  # stored and durable (or nothing to store)
    error: BaseException | None = None

    def dropped(self, ref: str | None = None) -> None:
        """Tell the writer that what this call staged was dropped (see ``forget``)."""
        if self.forget is not None:
            self.forget(ref)


@dataclass(eq=False)
class Move:
    """One ref's move in a group: the value it had and the commits chained on it.

    Attributes:
        name: the ref.
        expect: its value when read (None: it must not exist).
        batch: the commits of every call on this ref, in queue order.
        meta: ref metadata besides the read hint, time and length (a hashed segment's real
            name, a writer's own keys); a call may update it.
        jobs: the calls whose commits are in ``batch``.
        then: called in order with the ref's new value once it moved (HEAD follows a new
            branch, a writer keeps the value); an error fails the move's calls (stored).
    """

    name: str
    expect: RefValue | None
    batch: Batch
    meta: dict[str, Any] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    then: list[Callable[[RefValue], object]] = field(default_factory=list)

    def join(self, job: Job) -> Batch:
        """Count ``job`` among the calls of this move; return the batch to build its commits on."""
        if job not in self.jobs:
            self.jobs.append(job)
        return self.batch


class Group:
    """The refs one group commit moves, each with the commits chained on it."""

    def __init__(self) -> None:
        self.moves: dict[str, Move] = {}

    def start(self, job: Job, name: str, expect: RefValue | None, batch: Batch,
              meta: dict[str, Any] | None = None) -> Move:
        """A new move of ``name`` from ``expect`` onto ``batch`` (built on ``expect``'s target),
        with ``job`` among its calls."""
        move = self.moves[name] = Move(name, expect, batch, dict(meta or {}), [job])
        return move

    def drop(self, lane: str) -> list[Move]:
        """Take out the moves of the refs under ``lane`` (a call of that lane failed to stage)."""
        out = [m for n, m in self.moves.items() if n.startswith(lane + "/")]
        for m in out:
            del self.moves[m.name]
        return out


class GroupCommit:
    """Lands the calls in flight together as one group; see the module docstring.

    Args:
        plumbing: the store's write path.
        lock: held while a group is staged and landed (a writer's lock over what staging
            reads and changes: its caches of refs and commits).
    """

    def __init__(self, plumbing: Plumbing, lock: AbstractContextManager[Any] | None = None) -> None:
        self.plumbing = plumbing
        self._lock: AbstractContextManager[Any] = lock if lock is not None else nullcontext()
        self._cond = threading.Condition()  # guards the queue
        self._queue: list[Job] = []
        self._leading = False  # a caller is writing a group

    def land(self, job: Job) -> Any:
        """Store ``job`` together with the calls in flight and return its ``result`` once it is
        durable (on a durable store).

        Raises:
            what staging or writing the job raised; RefContended when it lost every retry,
            RefConflict when it was ``final`` and lost, RefLocked.
        """
        if open_stage() is not None:
            # a write batch of this thread: its moves are staged, not landed, so the calls of
            # other threads must not join its group (they would return before being stored)
            try:
                self._commit_jobs([job])
            finally:
                job.done = True
            if job.error is not None:
                raise job.error
            return job.result
        with self._cond:
            self._queue.append(job)
            if job.awaited:
                self._cond.notify_all()  # a leader may be waiting for it
            waited = self._leading
            while self._leading and not job.done:
                self._cond.wait()
            jobs: list[Job] = []
            if not job.done:
                self._leading = True
                if waited:  # calls from other threads are in flight: an awaited one may be among them
                    try:
                        self._linger()
                    except BaseException:  # interrupted while waiting: this call is not stored, others go on
                        self._queue.remove(job)
                        job.done = True
                        self._leading = False
                        self._cond.notify_all()
                        raise
                jobs, self._queue = self._queue, []
        if jobs:
            try:
                self._commit_jobs(jobs)
            except BaseException as e:  # interrupted: a call not known to have landed must not look stored
                for j in jobs:
                    if not j.landed and j.error is None:
                        j.error = e
                raise
            finally:
                with self._cond:
                    for j in jobs:
                        j.done = True
                    self._leading = False
                    self._cond.notify_all()
        if job.error is not None:
            raise job.error
        assert job.landed
        return job.result

    def _linger(self) -> None:
        """Wait (at most :data:`LINGER` seconds, holding ``self._cond``) while a queued call is
        ``awaiting`` one not queued yet and no ``awaited`` call is queued: any awaited call
        ends the wait (one of another thread must not wait for this one's)."""
        deadline = None
        while True:
            if any(j.awaited for j in self._queue) or not any(
                    j.awaiting is not None and j.awaiting() for j in self._queue):
                return
            now = time.monotonic()
            if deadline is None:
                deadline = now + LINGER
            elif now >= deadline:
                return
            self._cond.wait(deadline - now)

    def _commit_jobs(self, jobs: list[Job]) -> None:
        """Write ``jobs`` as groups until none lost a race (each job's error set on it)."""
        todo = jobs

        def attempt(_n: int) -> None:
            nonlocal todo
            lost = self._commit_group(todo)
            if lost:
                todo = lost
                # the race a call lost, so that giving up names its ref
                raise next((j.conflict for j in lost if j.conflict is not None), None) \
                    or RefConflict(lost[0].lane, None, None, "a ref moved under a group commit")

        with self._lock:
            try:
                self.plumbing.land(todo[0].lane, attempt)
            except Exception as e:  # noqa: BLE001 - handed to the callers that lost every retry
                for j in todo:
                    if j.error is None:
                        j.error = e
            except BaseException:  # interrupted: the writers' caches may show commits staged but not landed
                for j in jobs:
                    j.dropped()
                raise

    def _commit_group(self, jobs: list[Job]) -> list[Job]:
        """Stage ``jobs`` in order, write all their objects at once, then move each ref once.

        Returns the jobs that lost a race, in queue order (to be staged again); other
        failures are set on the jobs.
        """
        lost = self._stage_and_land(jobs)
        if len(lost) < 2:
            return lost
        ids = {id(j) for j in lost}
        return [j for j in jobs if id(j) in ids]

    def _stage_and_land(self, jobs: list[Job]) -> list[Job]:
        """:meth:`_commit_group`, returning the jobs that lost in the order they were found."""
        group = Group()
        lost: list[Job] = []
        failed: set[str] = set()  # lanes with a job that did not stage
        for job in jobs:
            if job.lane in failed:
                lost.append(job)
                continue
            job.conflict = None
            try:
                job.stage(group, job)
            except Exception as e:  # noqa: BLE001 - one call's failure is its own, not the group's
                failed.add(job.lane)
                job.dropped()
                if isinstance(e, RefConflict):
                    _lose(job, e, lost)
                else:
                    job.error = e
            finally:
                job.tries += 1
        for lane in failed:
            # the staged jobs of a lane that failed to stage go again, on a fresh read
            lost.extend(j for m in group.drop(lane) for j in m.jobs if j.error is None and j not in lost)
        moves = list(group.moves.values())
        moving = {id(j) for m in moves for j in m.jobs}
        for job in jobs:
            if job.error is None and id(job) not in moving and job not in lost:
                job.landed = True  # nothing to store (stored before)
        if not moves:
            return lost
        try:
            self.plumbing.write_many([m.batch for m in moves])
        except Exception as e:  # noqa: BLE001 - nothing moved: every staged call fails alike
            for m in moves:
                for j in m.jobs:
                    j.error = e
                    j.dropped()
            return lost
        results = self._swap(moves)
        for m, new in zip(moves, results, strict=True):
            if isinstance(new, Exception):
                for j in m.jobs:
                    j.dropped(m.name)
                    if isinstance(new, RefConflict):
                        _lose(j, new, lost)
                    else:  # this ref's calls fail; the other refs' landed
                        j.error = _restated(new)
                continue
            for j in m.jobs:
                j.landed = True
            try:
                for then in m.then:
                    then(new)
            except Exception as e:  # noqa: BLE001 - stored, but what follows the ref did not: say so
                for j in m.jobs:
                    j.error = e
        return lost

    def _swap(self, moves: list[Move]) -> list[RefValue | Exception]:
        """Move every ref of a group: per move, its new value or what failed it."""
        swaps = []
        for m in moves:
            assert m.batch.tip is not None
            swaps.append((m.name, m.batch.tip, m.expect, m.batch.ref_meta(**m.meta)))
        try:
            if len(swaps) == 1:  # a lone append moves its ref as it always did
                return [self.plumbing.swap(*swaps[0])]
            # every ref at once: on local disk in format 3 their intents share one sync
            return self.plumbing.swap_many(swaps)
        except Exception as e:  # noqa: BLE001 - no ref moved: every staged call fails alike
            return [e] * len(moves)


#: seconds: a write batch lands what it staged this often when asked (:func:`land_due`; or four
#: times as long as its last landing took, if more), so that a process killed while importing
#: loses little work; the environment variable ``CASTORE_LAND_EVERY`` sets another
LAND_EVERY = 0.25
_open = threading.local()  # .batch: the write batch open in this thread; .watch: watch_landings's


def _land_every() -> float:
    try:
        return float(os.environ.get("CASTORE_LAND_EVERY", LAND_EVERY))
    except ValueError:
        return LAND_EVERY


def landing_due() -> bool:
    """Whether :func:`land_due` would land now: a write batch is open in this thread and it
    is :meth:`~WriteBatch.due`. A writer that keeps its ref moves in memory between landings
    (an importer's session new with the import) stages them first. Raises nothing."""
    batch = getattr(_open, "batch", None)
    return batch is not None and batch.due()


def land_due() -> None:
    """Land the write batch open in this thread if it is :meth:`~WriteBatch.due` (nothing
    without one). A long writer (an importer, between runs of lines) calls it where its
    refs may land.

    Raises:
        as :meth:`WriteBatch.land`.
    """
    if landing_due():
        _open.batch.land()


@contextmanager
def watch_landings(each: Callable[[frozenset[str]], None]) -> Iterator[None]:
    """While the block runs, call ``each`` after every landing of this thread's write batch
    with the names of the refs it moved: also after a landing that lost races or failed
    part-way (:meth:`WriteBatch.land` raises after it), whose other refs moved. A caller that
    runs again after a lost race (an import) tells from it which of its writes are stored:
    those whose refs moved, not a rival's. The block may nest; the innermost watches."""
    before = getattr(_open, "watch", None)
    _open.watch = each
    try:
        yield
    finally:
        _open.watch = before


#: at most this many refs land with one :meth:`Plumbing.swap_many` (one sync each; bounds the
#: locks and open files a landing holds at once)
LAND_REFS = 512


def _folder(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def land_staged(plumbing: Plumbing, changes: Iterable[Staged], moved: set[str] | None = None) -> list[Exception]:
    """Land the staged ref changes of one store (see the module docstring): every ref but the
    HEADs by compare-and-swap from its base, in groups of :data:`LAND_REFS`; then the HEADs of
    the sessions none of whose refs failed; then the deletes of those sessions. What this
    handle kept of each ref (:meth:`Plumbing.read_for_write`) is its landed value, or
    forgotten. Returns what failed (a lost compare is a :class:`RefConflict`): the other
    refs landed, and their names are added to ``moved`` (also when this raises).

    Raises:
        InvalidEntry: a bad target (that group did not move). RefLocked, StorageError: the
            backend failed before a group moved (later groups did not land).
    """
    first: list[Staged] = []
    heads: list[Staged] = []
    deletes: list[Staged] = []
    for c in changes:
        if c.value is c.base:  # made and deleted again by the batch: nothing to land
            plumbing.forget(c.name)
            continue
        (deletes if c.value is None else heads if c.name.rsplit("/", 1)[-1] == "HEAD" else first).append(c)
    failed: list[Exception] = []
    failed_in: set[str] = set()  # folders of refs that did not land

    def blocked(c: Staged) -> bool:
        return any(f == _folder(c.name) or f.startswith(_folder(c.name) + "/") for f in failed_in)

    def move(group: list[Staged]) -> None:
        for i in range(0, len(group), LAND_REFS):
            chunk = group[i:i + LAND_REFS]
            moves = []
            for c in chunk:
                assert c.value is not None
                moves.append((c.name, c.value.target, c.base, c.value.meta))
            try:
                got = plumbing.swap_many(moves)
            except BaseException:
                for c in group[i:]:
                    plumbing.forget(c.name)
                raise
            for c, new in zip(chunk, got, strict=True):
                if isinstance(new, Exception):
                    failed.append(new)
                    failed_in.add(_folder(c.name))
                elif moved is not None:
                    moved.add(c.name)

    move(first)
    move([c for c in heads if not blocked(c)])
    for c in deletes:
        if blocked(c) or c.base is None:
            continue
        try:
            plumbing.delete(c.name, c.base)
        except RefConflict as e:
            failed.append(e)
        else:
            if moved is not None:
                moved.add(c.name)
    for c in heads:
        if blocked(c):
            plumbing.forget(c.name)
    return failed


class WriteBatch:
    """The calls of one thread landed together, many sessions at a time (see the module
    docstring): made by :meth:`castore.Store.batch`, used as ``with store.batch() as b:``.

    Inside, every ref move of this thread is staged; :meth:`land` lands what is staged so far
    (an importer calls it every so many files), and leaving the block lands the rest, also
    when an ordinary exception leaves it (what was done before it is kept, as without a
    batch); :func:`land_due` lands it when ``every`` seconds have passed since it last
    landed. Each landing writes the objects the batch held first, then its refs. Interrupted
    (KeyboardInterrupt, SystemExit), what is staged and held is dropped: the store is as the
    last landing left it. A batch opened inside another of the same thread joins
    it (its :meth:`land` does nothing). The stores' background repacks wait for the batch to
    end, then run once (a repack per sealed log would merge the batch's growing packs again
    and again while it writes).

    Args:
        plumbings: the write paths whose refs the batch may stage (a store's and its tenants').
        every: seconds between landings asked for by :func:`land_due` (default
            ``$CASTORE_LAND_EVERY``, else :data:`LAND_EVERY`).
    """

    def __init__(self, plumbings: Callable[[], Iterable[Plumbing]], every: float | None = None) -> None:
        self._plumbings = plumbings
        self._stage: RefStage | None = None
        self.every = every if every is not None else _land_every()
        self._landed_at = 0.0
        self._took = 0.0  # seconds the last landing took
        self._held: list[ObjectStore] = []  # the object stores whose background repack waits for the batch

    def __enter__(self) -> WriteBatch:
        if open_stage() is None:
            self._stage = RefStage().__enter__()
            self._landed_at = time.monotonic()
            _open.batch = self
            self._hold()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        stage, self._stage = self._stage, None
        if stage is None:
            return
        stage.__exit__()
        _open.batch = None
        try:
            if kind is not None and not issubclass(kind, Exception):
                self._drop(stage)
                return
            self._land(stage)
        finally:
            held, self._held = self._held, []
            for objects in held:
                objects.release_writes(keep=False)  # landed above, or dropped with the refs naming them
                objects.release_repack()

    def _hold(self) -> None:
        """Hold the background repack of every store the batch may write (see
        :meth:`~castore.objectstore.ObjectStore.hold_repack`): it runs once, after the batch;
        and hold the objects this thread writes to them (:meth:`~castore.objectstore.
        ObjectStore.hold_writes`): each landing writes them, as a few records, before its refs."""
        for p in self._plumbings():
            if all(p.objects is not o for o in self._held):
                p.objects.hold_repack()
                p.objects.hold_writes()
                self._held.append(p.objects)

    def __len__(self) -> int:
        """How many refs are staged."""
        return len(self._stage) if self._stage is not None else 0

    def land(self) -> None:
        """Land what is staged so far, and go on staging.

        Raises:
            RefConflict: a ref moved under the batch (that session's HEAD did not move; the
                other refs landed). RefLocked, InvalidEntry, StorageError.
        """
        stage = self._stage
        if stage is None:
            return
        stage.__exit__()
        began = time.monotonic()
        try:
            self._land(stage)
        finally:
            self._stage = RefStage().__enter__()
            self._landed_at = time.monotonic()
            self._took = self._landed_at - began
            self._hold()  # (tenants' stores opened since)

    def due(self) -> bool:
        """Whether :attr:`every` seconds have passed since the batch last landed (or opened),
        and four times as long as that landing took (a slow disk lands less often: landing
        stays a small share of the time)."""
        return self._stage is not None and time.monotonic() - self._landed_at >= max(self.every, 4 * self._took)

    def _land(self, stage: RefStage) -> None:
        failed: list[Exception] = []
        moved: set[str] = set()
        try:
            plumbings = list(self._plumbings())
            for p in plumbings:  # every object first: no ref may name one not written
                p.objects.write_held()
            for p in plumbings:
                failed.extend(land_staged(p, stage.take(p.refs), moved))
        except BaseException:
            self._drop(stage)
            raise
        finally:
            watcher = getattr(_open, "watch", None)
            if watcher is not None:
                watcher(frozenset(moved))
        if stage.stores():
            self._drop(stage)
            raise CastoreError("a write batch staged refs of a store it does not know; they were dropped")
        if failed:
            raise failed[0]

    def _drop(self, stage: RefStage) -> None:
        for p in self._plumbings():
            for c in stage.take(p.refs):
                p.forget(c.name)


def _restated(err: Exception) -> Exception:
    """``err`` as a caller should see it: a ref lock that could not be taken says what to do
    (it is not a lost race: not retried)."""
    if not isinstance(err, RefLocked):
        return err
    out = locked_error(err)
    out.__cause__ = err
    return out


def _lose(job: Job, conflict: RefConflict, lost: list[Job]) -> None:
    """``job`` lost a race: stage it again, or fail it when it is ``final``."""
    if job.final:
        job.error = conflict
    else:
        job.conflict = conflict
        lost.append(job)


__all__ = ["LAND_EVERY", "LAND_REFS", "LINGER", "Group", "GroupCommit", "Job", "Move", "WriteBatch", "land_due",
           "land_staged", "watch_landings"]
