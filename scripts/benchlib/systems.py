"""Systems on local disk: castore (durable default), Pi's JSONL session model, and the floor.

Every system has the same shape (see :class:`System`); the schedule in ``__main__`` drives
them step by step, alternating, and times each call from outside.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import Any

from . import cold, fsize
from .workload import Step, pi_line

APP, USER, SESSION = "bench", "u", "s"
#: the encrypted systems' master key: fixed, so a cold-read child can be given it (a benchmark, not a secret)
MASTER_KEY = "YmVuY2htYXJrIG1hc3RlciBrZXksIG5vdCBhIHNlY3I="


class System:
    """One store under test. Subclasses fill in what the system can do; None means "cannot"."""

    name = ""
    #: largest N this system is run at (None: any)
    max_n: int | None = None
    #: why the system stops at max_n
    max_n_reason = ""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.n = 0

    def start(self, n: int) -> None:
        """Prepare an empty session for an N-step run."""
        self.n = n

    def append(self, s: Step) -> None:
        """Append one step (timed by the caller)."""
        raise NotImplementedError

    def finish_build(self) -> None:
        """After the last append (untimed): flush handles, check the result."""

    def sizes(self) -> tuple[int | None, int | None]:
        """(bytes stored: sum of sizes, disk usage: st_blocks); None where it has no meaning."""
        return None, None

    def probe(self, s: Step, at_tip: bool) -> None:
        """After every read and fork: append step ``s`` to the N-step session (``at_tip``) or to a new one.

        The schedule alternates the two (and the systems), so their ratio is the growth of
        the append cost with N, free of the machine's drift during the build.
        """
        raise NotImplementedError

    def time_travel(self, mid: int) -> tuple[dict[str, Any], int]:
        """(state, number of messages) at step ``mid``, read through a fresh handle."""
        raise NotImplementedError

    def full_log(self) -> int:
        """Read every entry of the session (fresh handle); return how many."""
        raise NotImplementedError

    def fork(self, mid: int, k: int) -> int | None:
        """Fork the session at step ``mid`` (the k-th fork); return the bytes written."""
        raise NotImplementedError

    def cold_args(self) -> tuple[str, list[str]] | None:
        """(child code, argv) for a cold read of the current path, or None."""
        return None

    def cleanup(self) -> None:
        """Remove what ``start`` made."""

    def close(self) -> None:
        """Release everything (end of the run)."""


class CastoreLocal(System):
    """castore on local disk, ``castore.open(path)``: the durable default (fsync)."""

    name = "castore local"
    #: keyword arguments of every ``castore.open`` of this system (JSON: a cold-read child gets them too)
    open_options: dict[str, Any] = {}

    def start(self, n: int) -> None:
        import castore

        super().start(n)
        self.url = os.path.join(self.workdir, f"castore-{n}{'-enc' if self.open_options else ''}")
        shutil.rmtree(self.url, ignore_errors=True)
        self.store = castore.open(self.url, **self.open_options)
        self.session = self.store.session(APP, USER, SESSION)
        self.ids: list[str] = []
        self._msg = castore.Message

    def append(self, s: Step) -> None:
        self.ids.append(self.session.append(self._msg(role=s.role, content=s.content), state_delta=s.delta))

    def finish_build(self) -> None:
        # every step's state stays reachable: check a few (untimed)
        for i in sorted({0, self.n // 3, self.n - 1}):
            assert self.session.state(self.ids[i], scopes=False)["turn"] == i
        self.store.close()

    def sizes(self) -> tuple[int, int]:
        size, blocks, _ = fsize.tree(self.url)
        return size, blocks

    def probe(self, s: Step, at_tip: bool) -> None:
        if not hasattr(self, "_probe"):
            st = self._fresh()
            self._probe = (st, st.session(APP, USER, SESSION), st.session(APP, USER, "probe"))
        self._probe[1 if at_tip else 2].append(self._msg(role=s.role, content=s.content), state_delta=s.delta)

    def _fresh(self) -> Any:
        import castore

        return castore.open(self.url, **self.open_options)

    def time_travel(self, mid: int) -> tuple[dict[str, Any], int]:
        with self._fresh() as st:
            s = st.session(APP, USER, SESSION)
            return s.state(self.ids[mid]), len(s.messages(self.ids[mid]))

    def full_log(self) -> int:
        with self._fresh() as st:
            return len(st.session(APP, USER, SESSION).log())

    def fork(self, mid: int, k: int) -> int:
        before = fsize.tree(self.url)[0]
        with self._fresh() as st:
            st.session(APP, USER, SESSION).fork(f"fork-{k}", at=self.ids[mid])
        return fsize.tree(self.url)[0] - before

    def cold_args(self) -> tuple[str, list[str]]:
        return cold.CASTORE, [self.url, json.dumps(self.open_options), APP, USER, SESSION]

    def cleanup(self) -> None:
        if hasattr(self, "_probe"):
            self._probe[0].close()
            del self._probe
        shutil.rmtree(self.url, ignore_errors=True)


class CastoreEncrypted(CastoreLocal):
    """castore on local disk, encrypted: ``castore.open(path, encrypted=True, master_key=...)``.

    Everything else as :class:`CastoreLocal` (durable default); its key store is the store's
    own ``keys/`` folder, counted in its bytes.
    """

    name = "castore encrypted"
    open_options = {"encrypted": True, "master_key": MASTER_KEY}


class PiJsonl(System):
    """Pi's session model: one JSONL file, one line per entry with ``id``/``parentId``.

    Like Pi's SessionManager: a ``session`` header line, then per entry
    ``{"type": "message", "id", "parentId", "timestamp", "message": {...}}`` appended
    with open/append/close, plus an fsync per append (Pi itself does not fsync; we add it
    so its durability matches castore's and SqliteSaver's). The step's state delta rides
    on the entry (``stateDelta``). Loading parses the whole file and walks ``parentId``
    from the leaf; forking writes a new file with the path up to the fork point, as Pi's
    ``createBranchedSession`` does.
    """

    name = "Pi JSONL"

    def start(self, n: int) -> None:
        super().start(n)
        self.path = os.path.join(self.workdir, f"pi-{n}.jsonl")
        self.forks: list[str] = []
        self.rng = random.Random(n)
        self.ids: list[str] = []
        self.parent: str | None = None
        self._write(self.path, json.dumps({"type": "session", "version": 3, "id": f"bench-{n}",
                                           "timestamp": "2026-03-10T09:00:00.000Z", "cwd": "/bench"}) + "\n")

    @staticmethod
    def _write(path: str, line: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def append(self, s: Step) -> None:
        self.parent = self._append(self.path, self.parent, s)
        self.ids.append(self.parent)

    def probe(self, s: Step, at_tip: bool) -> None:
        if at_tip:
            self.parent = self._append(self.path, self.parent, s)
            return
        probe = self.path + ".probe"
        if probe not in self.forks:
            self.forks.append(probe)
            self._write(probe, json.dumps({"type": "session", "version": 3, "id": "probe",
                                           "timestamp": "2026-03-10T09:00:00.000Z", "cwd": "/bench"}) + "\n")
            self._probe_parent: str | None = None
        self._probe_parent = self._append(probe, self._probe_parent, s)

    def _append(self, path: str, parent: str | None, s: Step) -> str:
        eid = f"{self.rng.getrandbits(32):08x}"
        self._write(path, pi_line(s, eid, parent))
        return eid

    def sizes(self) -> tuple[int, int]:
        return fsize.files([self.path])

    def time_travel(self, mid: int) -> tuple[dict[str, Any], int]:
        path = cold.pi_path(self.path, self.ids[mid])
        state: dict[str, Any] = {}
        for e in path:
            state.update(e.get("stateDelta", {}))
        return state, sum(1 for e in path if e["type"] == "message")

    def full_log(self) -> int:
        return sum(1 for e in cold.pi_all(self.path) if e["type"] != "session")

    def fork(self, mid: int, k: int) -> int:
        path = cold.pi_path(self.path, self.ids[mid])
        out = f"{self.path}.fork-{k}"
        header = json.dumps({"type": "session", "version": 3, "id": f"fork-{k}", "parentSession": self.path,
                             "timestamp": "2026-03-10T10:00:00.000Z", "cwd": "/bench"})
        self._write(out, "".join([header + "\n"] + [json.dumps(e, separators=(",", ":")) + "\n" for e in path]))
        self.forks.append(out)
        return os.path.getsize(out)

    def cold_args(self) -> tuple[str, list[str]]:
        return cold.PI, [self.path]

    def cleanup(self) -> None:
        for p in [self.path, *self.forks]:
            if os.path.exists(p):
                os.remove(p)


class Floor(System):
    """The floor: the same message bytes appended to one file (fsync per append), read back."""

    name = "floor (append to a file)"

    def start(self, n: int) -> None:
        super().start(n)
        self.path = os.path.join(self.workdir, f"floor-{n}.txt")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)

    def append(self, s: Step) -> None:
        os.write(self.fd, s.content.encode() + b"\n")
        os.fsync(self.fd)

    def finish_build(self) -> None:
        os.close(self.fd)

    def probe(self, s: Step, at_tip: bool) -> None:
        path = self.path if at_tip else self.path + ".probe"
        fd = self._fds.get(path) if hasattr(self, "_fds") else None
        if fd is None:
            self._fds = getattr(self, "_fds", {})
            fd = self._fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, s.content.encode() + b"\n")
        os.fsync(fd)

    def sizes(self) -> tuple[int, int]:
        return fsize.files([self.path])

    def time_travel(self, mid: int) -> tuple[dict[str, Any], int]:
        raise NotImplementedError

    def full_log(self) -> int:
        raise NotImplementedError

    def fork(self, mid: int, k: int) -> int | None:
        raise NotImplementedError

    def cold_args(self) -> tuple[str, list[str]]:
        return cold.FLOOR, [self.path]

    def cleanup(self) -> None:
        for path, fd in getattr(self, "_fds", {}).items():
            os.close(fd)
            os.remove(path)
        self._fds = {}
        if os.path.exists(self.path):
            os.remove(self.path)
