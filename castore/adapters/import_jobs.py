"""An archive import spread over worker processes (``castore import claude|codex|gemini|pi --jobs N``),
and the retry every archive import runs under.

A vendor's import (``import_claude``, ``import_codex``, ``import_gemini``, ``import_pi``) finds
its files as it always did and hands them here (:func:`import_files`) in the order one process
imports them, each with the name of its *session group*: the files whose import reads or
writes the same sessions (a Claude Code session file and its subagent files, a Codex rollout
and its forks, a Gemini CLI session and its ``chats/<parent>/`` subagents, the files of one
Pi session id). A group is never split, so no session is written by two processes.

With one job the files are imported here, in this process. With N, the groups are dealt out
over N shares balanced by bytes (the largest group first, onto the lightest share), and N
worker processes each open the same store by URL (:attr:`castore.Store.open_options`: the
storage options it was opened with; the handle's redaction choice too) and import their
share, in order, in write batches as one process does. The workers are *spawned* (a fresh
interpreter): a store handle runs background threads (the repack, a pack map's readers), and
a child forked while one holds a lock inherits the lock held forever. They start side by side
and are sent their shares over their pipes once all are started (a share among a process's
arguments held its start until the worker before had started), and they ignore SIGINT until
they are up (:func:`_sigint_held`).

What comes back is what one process gives: the results in the order of the files, and on a
failure the error the first failing file (in that order) raised, after every worker is done;
the files the workers imported stay imported, and the next import finishes the rest. A
worker that dies without a word (killed) is reported as :class:`ImportJobError`. Ctrl-C
stops every worker (each drops its batch in flight, as one process does) and raises
:class:`KeyboardInterrupt`.

Repack: a write batch holds the background repack while it writes and starts it at its end.
On local disk a repack merges every sealed pack it lists, whoever wrote it, so N workers
finishing together would run N repacks over the same packs: each reads and rewrites them all,
the first to delete a pack wins and the others skip it, leaving its objects in two or more
new packs until the next repack (nothing is lost, the work and the space are spent N times).
So each worker merges only the packs it wrote (:attr:`Store.repack_own
<castore.store.Store.repack_own>`, as every writer on object storage does): the N
repacks run side by side, on N cores, over disjoint packs, and each worker waits for its own
before it reports (its store's close), so the import is over when its packs are merged. Run
once by the parent after the workers, the one repack of everything they wrote kept a core idle
for a third of a 200 MB import.

Two imports of one folder at once (two users, ``--follow`` and a manual import): the one
whose landing loses a race on a session's ref (:class:`~castore.errors.RefConflict`) imports
its files again, under :data:`IMPORT_RETRY` (:func:`castore.retry.retry`, the store's
one retry loop): an import reads each session's state first, so it goes on from what the
other one stored, and every line is stored once. Its results count what it stored over every
attempt: the files its lost attempt landed (the next finds them stored, and would say 0), not
the ones the other import stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import importlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CastoreError, RefConflict
from ..groupcommit import watch_landings
from ..refnames import SessionRefs
from ..retry import RetryPolicy, retry

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from ..store import Store

#: the module of each vendor's import; each has ``import_sources(store, units, out=..., **options)``
VENDORS = {"claude": "castore.adapters.claude_code", "codex": "castore.adapters.codex",
           "gemini": "castore.adapters.gemini", "pi": "castore.adapters.pi"}
#: the most workers the default starts
MAX_JOBS = 8
#: the default starts a worker per this many bytes of files (a spawned worker costs ~0.3 s
#: of start-up, an import reads a few MB a second): fewer bytes, one process
SHARE_BYTES = 8 << 20
#: an import that lost a race on a session's ref (another import of the same files) imports
#: again: each attempt goes on from what was stored, so a few are plenty; an attempt may take
#: long (a big folder), hence the generous time
IMPORT_RETRY = RetryPolicy(max_attempts=20, max_seconds=24 * 3600.0, base_delay=0.05, max_delay=1.0)
#: how long Ctrl-C waits for the workers to stop by themselves, then after interrupting them
#: before they are killed
_GRACE_SECONDS = 2.0
_STOP_SECONDS = 30.0


class ImportJobError(CastoreError, ValueError):
    """An import over worker processes could not run or finish: a jobs count below 1, or a
    worker that stopped without saying why (killed), or whose error could not be carried back."""


def import_files(store: Store, vendor: str, units: Sequence[Any], sessions: Sequence[str | tuple[str, ...]], *,
                 jobs: int | None = 1, **options: Any) -> list[Any]:
    """Import a vendor's files (``units``, in the order one process imports them) over ``jobs``
    processes (None: :func:`default_jobs`), retrying a lost race under :data:`IMPORT_RETRY`;
    ``sessions`` names, per unit, the session (or sessions) its import reads or writes
    besides its own: units that share one go to the same process (:func:`session_groups`);
    ``options`` go to the vendor's ``import_sources``.

    Returns:
        The results, one per unit, in the units' order.

    Raises:
        ImportJobError: ``jobs`` below 1; a worker died or its error could not be carried back.
        what the vendor's import raises (the first failing unit's error, in the units' order).
        KeyboardInterrupt: interrupted (every worker stopped).
    """
    if jobs is not None and jobs < 1:
        raise ImportJobError(f"--jobs must be 1 or more, not {jobs}")
    sizes = [_size(u) for u in units]
    groups = session_groups(sessions)
    n = default_jobs(store, sum(sizes), len(groups)) if jobs is None else min(jobs, len(groups))
    if n > 1 and not shareable(store):
        n = 1
    if n <= 1:
        return import_here(store, vendor, units, options)
    shares = split(groups, sizes, n)
    return _run_workers(store, vendor, [[(i, units[i]) for i in share] for share in shares], options)


def session_groups(sessions: Sequence[str | tuple[str, ...]]) -> list[list[int]]:
    """The indexes of the units that must go to one process: those naming a common session
    in ``sessions`` (one name or a tuple of names per unit), transitively; each group in
    ascending order, the groups by their first unit."""
    parent = list(range(len(sessions)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, names in enumerate(sessions):
        for name in (names,) if isinstance(names, str) else names:
            j = first.setdefault(name, i)
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    out: dict[int, list[int]] = {}
    for i in range(len(sessions)):
        out.setdefault(find(i), []).append(i)
    return list(out.values())


def shareable(store: Store) -> bool:
    """Whether worker processes can open ``store`` as this handle did: not a ``memory://``
    store (one per process), not an encrypted one (its keys stay with this handle), and one
    opened by :meth:`castore.Store.open` (whose options they reuse)."""
    return (store.open_options is not None and not store.url.startswith("memory://")
            and store.encryption is None and store.root is store)


def default_jobs(store: Store, total_bytes: int, groups: int) -> int:
    """How many processes an import of ``groups`` session groups adding up to ``total_bytes``
    uses unless told: a worker per :data:`SHARE_BYTES` up to the machine's cores (at most
    :data:`MAX_JOBS`), on a local store; 1 for a few files, a small folder, and a store
    elsewhere (a memory store is one per process; an object store's requests, not the
    cores, bound an import; ask for ``jobs`` there)."""
    if not shareable(store) or "://" in store.url and not store.url.startswith("file://"):
        return 1
    return max(1, min(os.cpu_count() or 1, MAX_JOBS, groups, total_bytes // SHARE_BYTES))


def split(groups: Sequence[Sequence[int]], sizes: Sequence[int], n: int) -> list[list[int]]:
    """Deal ``groups`` (lists of unit indexes) over ``n`` shares balanced by bytes (``sizes``
    per unit): the largest group first, onto the lightest share. Each share's indexes come
    in ascending order (the order one process imports them); empty shares are dropped."""
    heap = [(0, k) for k in range(n)]
    shares: list[list[int]] = [[] for _ in range(n)]
    for g in sorted(groups, key=lambda g: (-sum(sizes[i] for i in g), g[0])):
        load, k = heapq.heappop(heap)
        shares[k].extend(g)
        heapq.heappush(heap, (load + sum(sizes[i] for i in g), k))
    return [sorted(s) for s in shares if s]


def import_here(store: Store, vendor: str, units: Sequence[Any], options: dict[str, Any],
                out: list[Any] | None = None) -> list[Any]:
    """Import ``units`` in this process with the vendor's ``import_sources``, again from what
    is stored after a lost race (:data:`IMPORT_RETRY`); ``out`` gets the results as each unit
    is done (a caller sees how far an attempt that raised got).

    Each result says what this process stored of its file over every attempt
    (:func:`_carried`): an attempt that lost a race on some sessions landed the others (the
    landings' moved refs say which, :func:`~castore.groupcommit.watch_landings`), and the
    next attempt finds those files stored; what a rival stored is not counted. A rival that
    records a file's position after this import read it (and stored its lines, or found them
    stored) is a lost race too: the importer's ``set_info(expect=...)`` compares the position
    it read, and the next attempt finds the file the rival's.

    Raises:
        what the vendor's import raises; RefContended: races lost :data:`IMPORT_RETRY` times.
    """
    import_sources: Callable[..., list[Any]] = importlib.import_module(VENDORS[vendor]).import_sources
    got: list[Any] = [] if out is None else out
    kept: dict[int, Any] = {}  # unit -> what the attempts that lost a race stored of it

    def attempt(_n: int) -> list[Any]:
        got.clear()
        stored: list[bool] = []  # per result: its session's HEAD (its position) moved

        def landed(moved: frozenset[str]) -> None:
            # a result's session moved in the first landing after it (its HEAD lands last)
            stored.extend(SessionRefs.of(*_key(r)).head in moved for r in got[len(stored):])

        try:
            with watch_landings(landed):
                return import_sources(store, units, out=got, **options)
        except RefConflict:
            for i, r in enumerate(got[:len(stored)]):
                if stored[i]:
                    kept[i] = r if i not in kept else _carried(kept[i], r)
            raise

    results = retry("an archive import", attempt, IMPORT_RETRY)
    for i, earlier in kept.items():
        results[i] = _carried(earlier, results[i])
    return results


#: the counts of a result that add up over attempts (a FileResult's lines, a Pi ImportResult's
#: entries, blobs and bytes)
_ADDED = ("lines", "entries", "blobs", "bytes_written")


def _key(result: Any) -> tuple[str, str, str]:
    key: tuple[str, str, str] = getattr(result, "session", None) or result.key
    return key


def _carried(earlier: Any, later: Any) -> Any:
    """``later`` (a result of one file, a dataclass) with what ``earlier`` (an attempt that
    lost a race elsewhere) stored of the same file added: the counts summed, the lists and
    maps joined (the secrets redacted per kind summed); where the file stands (``total``,
    ``offset``, ``head``, ...) is ``later``'s."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(later):
        a, b = getattr(earlier, f.name), getattr(later, f.name)
        if f.name in _ADDED and isinstance(a, int):
            changes[f.name] = a + b
        elif f.name == "redacted":
            changes[f.name] = {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}
        elif isinstance(a, list):
            changes[f.name] = a + [x for x in b if x not in a]
        elif isinstance(a, dict):
            changes[f.name] = {**a, **b}
    return dataclasses.replace(later, **changes)


def _size(unit: Any) -> int:
    try:
        return os.path.getsize(getattr(unit, "path", unit))
    except OSError:
        return 0


# -- the workers -------------------------------------------------------------------------------
def _run_workers(store: Store, vendor: str, shares: list[list[tuple[int, Any]]],
                 options: dict[str, Any]) -> list[Any]:
    store.init()  # made once here, not raced by the workers
    redact = store.redactor is not None
    ctx = multiprocessing.get_context("spawn")
    workers: list[tuple[Any, Connection, list[int]]] = []
    results: dict[int, Any] = {}
    failures: list[tuple[int, BaseException]] = []
    try:
        # Every worker is started before any is sent its share: a start writes the process's
        # arguments into a pipe the child reads once its interpreter is up, so a share (a few
        # hundred KB of units) among them would hold each start until the worker before had
        # started, one start-up after another.
        with _sigint_held() as sigint:
            for share in shares:
                conn, child = ctx.Pipe()
                p = ctx.Process(target=_work, name="castore-import", args=(
                    child, store.url, store.open_options, redact, vendor, sigint))
                p.start()
                child.close()
                workers.append((p, conn, [i for i, _ in share]))
        for (_, conn, _), share in zip(workers, shares, strict=True):
            with contextlib.suppress(OSError):  # a worker gone already: reported below
                conn.send(([u for _, u in share], options))
        for p, conn, idx in workers:
            try:
                done, failed = conn.recv()
            except EOFError:
                p.join()
                failures.append((idx[0], ImportJobError(
                    f"an import worker stopped (exit status {p.exitcode}) before it was done; the files it "
                    "imported are kept: import again to finish")))
                continue
            results.update(zip(idx, done, strict=False))
            if failed is not None:
                failures.append((idx[min(len(done), len(idx) - 1)], failed))
        for p, _, _ in workers:
            p.join()
    except KeyboardInterrupt:
        _stop(workers)
        raise
    finally:
        for _, conn, _ in workers:
            conn.close()
    if failures:
        raise min(failures, key=lambda f: f[0])[1]
    return [results[i] for i in sorted(results)]


@contextlib.contextmanager
def _sigint_held() -> Iterator[bool]:
    """Start processes inside with SIGINT ignored, and hold this process's own: yields whether
    a worker should take SIGINT as KeyboardInterrupt once it is up (:func:`_work`).

    A Ctrl-C at the terminal reaches the workers too, and one that came while a worker's
    interpreter was still importing (before :func:`_work` runs) printed a traceback. An
    ignored signal stays ignored across ``exec``, and Python then leaves it so: a worker
    takes SIGINT again once it is in :func:`_work`. Meanwhile this process's SIGINT is blocked,
    not lost: on Linux a blocked signal stays pending whatever its action, and is raised when
    the block ends (multiprocessing's resource tracker, started first, unblocks SIGINT as it
    starts). Where that cannot be done (not the main thread, no ``pthread_sigmask``, SIGINT
    not Python's), processes start as they are and yield False when SIGINT is ignored here.
    """
    old = signal.getsignal(signal.SIGINT)
    if (old is not signal.default_int_handler or not hasattr(signal, "pthread_sigmask")
            or threading.current_thread() is not threading.main_thread()):
        yield old is not signal.SIG_IGN
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield True
        finally:
            signal.signal(signal.SIGINT, old)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _stop(workers: list[tuple[Any, Connection, list[int]]]) -> None:
    """Interrupt every worker still running (each drops its batch in flight), and wait for
    them: a Ctrl-C at the terminal reached them too, so first they are given a moment to stop
    by themselves (a second interrupt could cut short their cleanup). A worker not yet sent
    its share (one still starting ignored that Ctrl-C) finds its pipe closed and returns."""
    for _, conn, _ in workers:
        conn.close()
    deadline = time.monotonic() + _GRACE_SECONDS
    for p, _, _ in workers:
        p.join(max(0.0, deadline - time.monotonic()))
    for p, _, _ in workers:
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGINT)
    deadline = time.monotonic() + _STOP_SECONDS
    for p, _, _ in workers:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _work(conn: Connection, url: str, open_options: dict[str, Any], redact: bool, vendor: str,
          sigint: bool) -> None:
    """A worker: receive ``(units, options)``, open the store, import ``units``, send back
    ``(results, error or None)``. Started with SIGINT ignored (:func:`_sigint_held`), it takes
    it as KeyboardInterrupt from here on when ``sigint``."""
    from ..store import Store

    try:
        if sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        units, options = conn.recv()
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the parent is gone, or was interrupted before it sent the share
    out: list[Any] = []
    failed: BaseException | None = None
    try:
        store = Store.open(url, **open_options)
        store.repack_own = True  # side by side with the other workers' (module docstring)
        try:
            if redact:
                store.redact_writes(True)
            import_here(store, vendor, units, options, out)
        finally:
            store.close()
    except KeyboardInterrupt:
        return  # the parent was interrupted too: it says so
    except BaseException as e:  # noqa: BLE001 - carried to the parent, which raises it
        failed = _portable(e)
    with contextlib.suppress(OSError):  # the parent is gone (interrupted)
        conn.send((out, failed))
    conn.close()


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (to be raised in the parent as it is), else an
    :class:`ImportJobError` with its message (what the CLI's error line shows)."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001 - any exception class whose constructor pickle cannot call
        return ImportJobError(str(e))
    return e
