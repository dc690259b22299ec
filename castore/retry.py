"""The retry policy of a compare-and-swap: how long a writer that lost a race on a ref
keeps trying, and the one retry loop (:func:`retry`) every landing runs under.

:meth:`castore.plumbing.Plumbing.land` runs a write's read-build-swap attempt here; a whole
archive import, which is no one ref's landing, calls :func:`retry` itself
(:mod:`castore.adapters.import_jobs`). Not the retry of a storage call that failed for a
passing cause: that is :mod:`castore.storage.retrying`'s.

After a lost race the writer sleeps a jittered, exponentially growing delay; it
gives up after a cap on attempts or on total time and raises :class:`RefContended`, naming
the ref, the attempts and the time spent. A ref lock that cannot be taken
(:class:`~castore.errors.RefLocked`) is not a lost race: it is raised at once, naming the
lock file and what to do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .entries import Record
from .errors import CastoreError, RefConflict, RefLocked

T = TypeVar("T")


class BadRetryPolicy(CastoreError, ValueError):
    """A :class:`RetryPolicy` with limits that cannot work (no attempt, no time, negative delays)."""


@dataclass(frozen=True, repr=False, eq=False)
class RetryPolicy(Record):
    """How long a writer that lost a compare-and-swap race keeps trying.

    After the n-th lost race the writer sleeps a random part (full jitter) of
    ``min(base_delay * 2**n, max_delay)``, so rival writers spread out instead of colliding
    again in step; it gives up after ``max_attempts`` attempts or ``max_seconds`` seconds,
    whichever comes first. A ref lock that cannot be taken is never retried here: the
    storage already waited for it.
    """

    max_attempts: int = 200
    max_seconds: float = 60.0
    base_delay: float = 0.001
    max_delay: float = 0.05

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.max_seconds <= 0 or self.base_delay < 0 or self.max_delay < 0:
            raise BadRetryPolicy(f"bad retry policy {self!r}: attempts >= 1, seconds > 0, delays >= 0")

    def delay(self, attempt: int) -> float:
        """The sleep after the ``attempt``-th lost race (0-based), jittered."""
        cap = min(self.base_delay * (2 ** min(attempt, 30)), self.max_delay)
        return cap * int.from_bytes(os.urandom(2), "big") / 65536


#: the policy every writer uses unless given another
DEFAULT_RETRY = RetryPolicy()


class RefContended(RefConflict):
    """A ref kept changing under a writer until its :class:`RetryPolicy` ran out.

    Attributes:
        ref: the contended ref (or a description of the refs).
        attempts: how many compare-and-swap attempts were made.
        seconds: how long the writer tried.
    """

    def __init__(self, ref: str, attempts: int, seconds: float, last: RefConflict | None = None) -> None:
        super().__init__(
            ref, last.expected if last else None, last.actual if last else None,
            f"ref {ref!r} is contended: {attempts} compare-and-swap attempts in {seconds:.1f}s all lost "
            "to other writers; nothing of this write landed, try again (or use fewer concurrent writers)",
        )
        self.attempts = attempts
        self.seconds = seconds


def locked_error(err: RefLocked) -> RefLocked:
    """``err`` restated with what to do: a lock is not a race, it is not retried."""
    out = RefLocked(
        err.ref, err.expected, err.actual,
        f"{err}; if no castore process is writing there, the lock is stale: run `castore fsck` "
        "to list stale locks and `castore gc` to clear them (or delete the .lock file)",
    )
    return out


def retry(what: str, attempt: Callable[[int], T], policy: RetryPolicy | None = None,
          final: Callable[[RefConflict], bool] | None = None,
          give_up: Callable[[int, float], Exception] | None = None) -> T:
    """Run ``attempt(n)`` until it returns, retrying a lost race under ``policy``.

    Args:
        what: the contended ref (named by the error when giving up).
        attempt: one read-build-swap attempt; raises :class:`RefConflict` when it lost.
        policy: the retry policy (default :data:`DEFAULT_RETRY`).
        final: a conflict for which it returns True is raised as is (not retried).
        give_up: builds the error raised when the policy runs out (from the attempts made
            and the seconds spent), for a contended thing that is not a ref.

    Raises:
        RefContended: every attempt lost, within the policy's limits (or ``give_up``'s error).
        RefLocked: a ref lock could not be taken (not retried; says what to do).
        whatever ``attempt`` raises besides RefConflict.
    """
    policy = policy or DEFAULT_RETRY
    start = time.monotonic()
    last: RefConflict | None = None
    n = 0
    while True:
        try:
            return attempt(n)
        except RefLocked as e:
            raise locked_error(e) from e
        except RefConflict as e:
            if final is not None and final(e):
                raise
            last = e
        n += 1
        elapsed = time.monotonic() - start
        if n >= policy.max_attempts or elapsed >= policy.max_seconds:
            if give_up is not None:
                raise give_up(n, elapsed) from last
            # name the ref that was actually contended when the attempt said which
            raise RefContended(last.ref if last is not None and last.ref else what, n, elapsed, last) from last
        time.sleep(policy.delay(n - 1))


__all__ = ["DEFAULT_RETRY", "BadRetryPolicy", "RefContended", "RetryPolicy", "locked_error", "retry"]
