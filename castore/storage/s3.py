"""S3 storage through s3fs: one PUT per write, one GET per read, conditional PUTs for refs.

The only module that imports s3fs/botocore. Requests go straight to the S3 client
(``S3FileSystem._call_s3``) so that no HEAD precedes a GET and no listing cache is
consulted. Batches (:meth:`S3Storage.read_many`, :meth:`S3Storage.write_many`) run
concurrently on s3fs's event loop, at most :data:`CONCURRENCY` requests in flight;
:meth:`S3Storage.delete_many` sends one multi-object DeleteObjects per 1,000 keys.

Compare-and-swap uses ``If-None-Match: *`` (create) and ``If-Match: <etag>`` (replace);
a lost condition arrives as HTTP 412 ``PreconditionFailed`` and becomes
:class:`~castore.storage.base.PreconditionFailed`; 409 ``ConditionalRequestConflict`` is
retried. Tokens are ETags in their quoted form (``"abc..."``), as S3 returns them.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import s3fs
from aiobotocore.session import AioSession
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.loaders import Loader, create_loader
from fsspec.asyn import sync

from ..errors import AccessDenied, StorageError
from .base import DeleteIncomplete, Journal, PreconditionFailed, Storage, Token, Versioned, check_key

#: most requests in flight at once in a batch
CONCURRENCY = 64
#: attempts of a conditional write answered with 409 ConditionalRequestConflict
CONFLICT_ATTEMPTS = 6
#: keys per DeleteObjects request (S3's limit)
DELETE_BATCH = 1000

_T = TypeVar("_T")
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "ExpiredToken", "403"}
_MISSING = {"NoSuchKey", "404", "NotFound"}


_LOADERS: dict[str | None, Loader] = {}


def _session(**kwargs: Any) -> AioSession:
    """The botocore session s3fs would make from ``kwargs``, sharing one model loader per
    data path with every other S3 storage of the process.

    A botocore session parses S3's service model and the endpoint rules (large JSON files)
    through its loader the first time it makes a client: about 0.2 s per storage opened.
    The loader only reads botocore's data files, so sharing it shares nothing of a
    storage's credentials, profile or region, which stay each session's own.
    """
    session = AioSession(**kwargs)
    data_path = session.get_config_variable("data_path")
    loader = _LOADERS.get(data_path)
    if loader is None:
        loader = _LOADERS[data_path] = create_loader(data_path)
    session.register_component("data_loader", loader)
    return session


#: options that must be strings when given (a number from ``-o endpoint_url=9000`` is not)
_STRINGS = ("endpoint_url", "key", "secret", "token", "profile", "client_kwargs.endpoint_url",
            "client_kwargs.region_name", "config_kwargs.region_name")


def _check_shapes(url: str, opts: Mapping[str, Any]) -> None:
    """Refuse option values of the wrong shape that s3fs or botocore would only trip over
    later, with a bare ``TypeError`` or ``ValueError`` or (a pool size below 1) a hang:
    ``retries`` a whole number, ``config_kwargs`` and ``client_kwargs`` mappings (``-o
    client_kwargs.region_name=...`` on the command line), ``config_kwargs.retries`` a mapping,
    ``config_kwargs.max_pool_connections`` a whole number above 0, and :data:`_STRINGS` strings.

    Raises:
        StorageError: naming the option.
    """
    def refuse(name: str, must: str, value: Any) -> StorageError:
        return StorageError(f"cannot open {url}: the storage option {name} must be {must}, not {value!r}", url)

    retries = opts.get("retries")
    try:
        if retries is not None:
            int(retries)
    except (TypeError, ValueError):
        raise refuse("retries", "a whole number", retries) from None
    for name in ("config_kwargs", "client_kwargs"):
        value = opts.get(name)
        if value is not None and not isinstance(value, Mapping):
            raise refuse(name, f"a mapping (-o {name}.KEY=VALUE)", value)

    def get(dotted: str) -> Any:
        first, _, rest = dotted.partition(".")
        return opts.get(first) if not rest else (opts.get(first) or {}).get(rest)

    for name in _STRINGS:
        if (value := get(name)) is not None and not isinstance(value, str):
            raise refuse(name, "a string", value)
    pool = get("config_kwargs.max_pool_connections")
    if pool is not None and (not isinstance(pool, int) or isinstance(pool, bool) or pool < 1):
        raise refuse("config_kwargs.max_pool_connections", "a whole number above 0", pool)
    if (value := get("config_kwargs.retries")) is not None and not isinstance(value, Mapping):
        raise refuse("config_kwargs.retries", "a mapping", value)


def _client_error(e: BaseException) -> ClientError | None:
    """The botocore ClientError behind ``e`` (itself or its cause), if any."""
    for x in (e, e.__cause__, e.__context__):
        if isinstance(x, ClientError):
            return x
    return None


def _code(e: BaseException) -> tuple[str, int]:
    """(S3 error code, HTTP status) of ``e``; ("", 0) when it is not an S3 answer."""
    ce = _client_error(e)
    if ce is None:
        return "", 0
    code = str(ce.response.get("Error", {}).get("Code", ""))
    status = int(ce.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _quote(etag: str) -> Token:
    """ETags in one form: quoted, as S3 sends them."""
    if etag.startswith('"') or etag.startswith("W/"):
        return etag
    return f'"{etag}"'


class S3Storage(Storage):
    """Storage in an S3 bucket under a prefix (``s3://bucket/prefix``).

    Attributes:
        bucket: the bucket name.
        prefix: the key prefix (no leading or trailing slash; may be empty).
        request_count: the number of HTTP requests sent to S3 so far (retries included).
    """

    durable = True

    def __init__(self, path: str, **storage_options: Any) -> None:
        """Open ``bucket/prefix`` with s3fs options (endpoint_url, key, secret, client_kwargs, ...).

        ``retries`` (s3fs's attempts on connection errors, default 5) may be given too.

        Nothing is sent to S3 here; a missing bucket or bad endpoint shows at first use.

        Raises:
            StorageError: the path names no bucket or the options are invalid.
        """
        bucket, _, prefix = path.strip("/").partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        if not bucket:
            raise StorageError("an S3 URL needs a bucket: s3://bucket/prefix", self.url)
        opts = dict(storage_options)
        _check_shapes(self.url, opts)
        ck = dict(opts.pop("config_kwargs", None) or {})
        ck.setdefault("max_pool_connections", CONCURRENCY)
        # castore retries idempotent calls itself (castore.storage.retrying), so the layers
        # below try little: otherwise an unreachable endpoint takes many seconds to report.
        ck.setdefault("retries", {"total_max_attempts": 2, "mode": "standard"})
        ck.setdefault("connect_timeout", 5)
        retries = opts.pop("retries", 2)  # s3fs's own retry count (a class attribute there)
        #: the endpoint requests go to, as botocore picks it: the option, else the environment
        self.endpoint: str = (
            opts.get("endpoint_url")
            or (opts.get("client_kwargs") or {}).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or "the AWS default endpoint"
        )
        self.request_count = 0
        self._hooked: set[int] = set()
        try:
            self._fs = s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs=ck, **opts)
            if self._fs.session is None:  # else the caller's own session
                self._fs.session = _session(**self._fs.kwargs)
        except Exception as e:  # bad option names or values
            raise StorageError(f"cannot open {self.url}: {e}", self.url) from e
        if retries is not None:
            self._fs.retries = max(1, int(retries))
        self._owner = True  # whether close() ends the S3 client (children share their parent's)

    def child(self, prefix: str) -> S3Storage:
        """The same bucket and options below the folder ``prefix`` of this storage, sharing this storage's
        S3 client (its connections); closing the child leaves the client to this storage.
        Requests are counted per client: the child's ``request_count`` counts every request
        of the shared client from its creation on, and so does this storage's.

        Raises:
            InvalidName: ``prefix`` is not a valid key.
        """
        sub = self._key(check_key(prefix))
        out = object.__new__(S3Storage)
        out.bucket, out.prefix, out.endpoint, out._fs = self.bucket, sub, self.endpoint, self._fs
        out.url = f"s3://{self.bucket}/{sub}"
        out.request_count, out._hooked, out._owner = 0, set(), False
        return out

    # ---------------------------------------------------------------- plumbing

    def _key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix and key else (self.prefix or key)

    def _counter(self) -> Callable[..., None]:
        """A botocore before-send hook that counts into this storage without keeping it alive.

        s3fs's weakref.finalize holds the client until the file system is collected, and the
        client holds its hooks: a bound method here would keep this storage, its file system
        and botocore's parsed service models alive for the rest of the process.
        """
        ref = weakref.ref(self)

        def count(**_: Any) -> None:
            me = ref()
            if me is not None:
                me.request_count += 1

        return count

    async def _s3(self, method: str, **kw: Any) -> Any:
        """One S3 API call (counted per HTTP request via botocore's before-send event)."""
        await self._fs.set_session()
        client = await self._fs.get_s3(self.bucket)
        if id(client) not in self._hooked:
            client.meta.events.register("before-send.s3", self._counter())
            self._hooked.add(id(client))
        return await self._fs._call_s3(method, Bucket=self.bucket, **kw)  # noqa: SLF001 - s3fs has no public call with retries

    async def _get(self, key: str) -> tuple[bytes, str]:
        resp = await self._s3("get_object", Key=self._key(key))
        try:
            data = await resp["Body"].read()
        finally:
            resp["Body"].close()
        return data, _quote(resp.get("ETag", ""))

    def _run(self, fn: Callable[..., Awaitable[_T]], *args: Any, **kw: Any) -> _T:
        return sync(self._fs.loop, fn, *args, **kw)

    def _error(self, e: BaseException, what: str, key: str | None = None) -> StorageError:
        """A StorageError with a clear message for a backend exception (chain it with ``from``)."""
        where = f"{self.url}/{key}" if key else self.url
        code, status = _code(e)
        if isinstance(e, (EndpointConnectionError, ConnectTimeoutError)) or (
            isinstance(e, HTTPClientError) and not code
        ):
            msg = f"cannot reach S3 endpoint {self.endpoint} ({what} {where}): {e}"
        elif isinstance(e, (NoCredentialsError, PartialCredentialsError)):
            msg = f"no usable S3 credentials for {self.url}: pass key/secret or set AWS_ACCESS_KEY_ID ({e})"
        elif code in _DENIED or status == 403 or (isinstance(e, PermissionError) and not code):
            return AccessDenied(f"access denied by S3 ({what} {where}): check the credentials and permissions "
                                f"({code or e})", where)
        elif code == "NoSuchBucket":
            msg = (f"bucket {self.bucket!r} does not exist at {self.endpoint} ({what} {where}): create it, "
                   f"or run `castore init` on this URL, which creates it")
        else:
            msg = f"S3 {what} {where} failed: {code + ': ' if code else ''}{e}"
        return StorageError(msg, where)

    def _missing(self, e: BaseException) -> bool:
        """Whether ``e`` says the key is missing (a missing bucket is not a missing key)."""
        code, status = _code(e)
        if code == "NoSuchBucket":
            return False
        return code in _MISSING or status == 404 or (not code and isinstance(e, FileNotFoundError))

    def _batch(self, fn: Callable[..., Awaitable[_T]], args: Iterable[tuple[Any, ...]], what: str) -> list[_T]:
        """Run ``fn(*a)`` for every ``a`` concurrently (at most CONCURRENCY in flight)."""

        async def all_() -> list[Any]:
            sem = asyncio.Semaphore(CONCURRENCY)

            async def one(a: tuple[Any, ...]) -> Any:
                async with sem:
                    return await fn(*a)

            return await asyncio.gather(*(one(a) for a in args), return_exceptions=True)

        results = self._run(all_)
        for r in results:
            if isinstance(r, BaseException):
                raise r if isinstance(r, StorageError) else self._error(r, what) from r
        return results

    # ---------------------------------------------------------------- reads

    def read(self, key: str) -> bytes:
        """Return the bytes at ``key`` (one GET).

        Raises:
            FileNotFoundError: nothing is stored there.
            StorageError: S3 failed, or the bucket does not exist.
        """
        try:
            return self._run(self._get, key)[0]
        except Exception as e:
            if self._missing(e):
                raise FileNotFoundError(f"{self.url}/{key}") from e
            raise self._error(e, "read", key) from e

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """Return ``size`` bytes of ``key`` from ``offset`` (fewer if the object is shorter):
        one GET with a ``Range`` header, so a record of a large pack costs its own bytes.

        Raises:
            FileNotFoundError: nothing is stored there.
            StorageError: S3 failed, or the bucket does not exist.
        """
        if size <= 0:
            return b""

        async def ranged() -> bytes:
            resp = await self._s3("get_object", Key=self._key(key), Range=f"bytes={offset}-{offset + size - 1}")
            try:
                return bytes(await resp["Body"].read())
            finally:
                resp["Body"].close()

        try:
            return self._run(ranged)
        except Exception as e:
            if self._missing(e):
                raise FileNotFoundError(f"{self.url}/{key}") from e
            if _code(e)[1] == 416:  # the range starts at or past the end
                return b""
            raise self._error(e, "read", key) from e

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Read several keys concurrently, one GET each.

        Returns:
            A dict from each key to its bytes, or None where nothing is stored.

        Raises:
            StorageError: S3 failed for a reason other than a missing key.
        """
        keys = list(dict.fromkeys(keys))

        async def one(k: str) -> bytes | None:
            try:
                return (await self._get(k))[0]
            except Exception as e:
                if self._missing(e):
                    return None
                raise self._error(e, "read", k) from e

        return dict(zip(keys, self._batch(one, [(k,) for k in keys], "read"), strict=True)) if keys else {}

    def read_heads(self, keys: Iterable[str], size: int) -> dict[str, bytes | None]:
        """The first ``size`` bytes of several keys concurrently, one ranged GET each.

        Returns:
            A dict from each key to its first bytes, or None where nothing is stored.

        Raises:
            StorageError: S3 failed for a reason other than a missing key.
        """
        keys = list(dict.fromkeys(keys))

        async def one(k: str) -> bytes | None:
            try:
                resp = await self._s3("get_object", Key=self._key(k), Range=f"bytes=0-{size - 1}")
                try:
                    return bytes(await resp["Body"].read())
                finally:
                    resp["Body"].close()
            except Exception as e:
                if self._missing(e):
                    return None
                if _code(e)[1] == 416:  # an empty object
                    return b""
                raise self._error(e, "read", k) from e

        return dict(zip(keys, self._batch(one, [(k,) for k in keys], "read"), strict=True)) if keys and size > 0 \
            else {k: b"" for k in keys}

    def read_versioned(self, key: str) -> Versioned | None:
        """Read a mutable file and its ETag with one GET (no listing cache).

        Returns:
            ``Versioned(data, etag)`` (quoted ETag), or None when the key does not exist.

        Raises:
            StorageError: S3 failed.
        """
        try:
            data, etag = self._run(self._get, key)
        except Exception as e:
            if self._missing(e):
                return None
            raise self._error(e, "read", key) from e
        return Versioned(data, etag)

    async def _head(self, key: str) -> dict[str, Any] | None:
        try:
            return await self._s3("head_object", Key=self._key(key))
        except Exception as e:
            if self._missing(e):
                return None
            raise

    def exists(self, key: str) -> bool:
        """Whether something is stored at ``key`` (one HEAD).

        Raises:
            StorageError: S3 failed.
        """
        try:
            return self._run(self._head, key) is not None
        except Exception as e:
            raise self._error(e, "check", key) from e

    def mtime(self, key: str) -> float | None:
        """LastModified of ``key`` as a POSIX timestamp, or None if missing (one HEAD).

        Raises:
            StorageError: S3 failed.
        """
        try:
            head = self._run(self._head, key)
        except Exception as e:
            raise self._error(e, "stat", key) from e
        return None if head is None else head["LastModified"].timestamp()

    # ---------------------------------------------------------------- writes

    async def _put(self, key: str, data: bytes, **cond: str) -> dict[str, Any]:
        return await self._s3("put_object", Key=self._key(key), Body=data, **cond)

    def write(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key`` with one PUT.

        Raises:
            StorageError: S3 failed (a missing bucket is named; nothing is created).
        """
        try:
            self._run(self._put, key, bytes(data))
        except Exception as e:
            raise self._error(e, "write", key) from e

    def write_many(self, items: Mapping[str, bytes]) -> None:
        """Store several keys concurrently, one PUT each.

        Raises:
            StorageError: S3 failed for at least one key; others may have been written.
        """

        async def one(k: str, v: bytes) -> None:
            try:
                await self._put(k, v)
            except Exception as e:
                raise self._error(e, "write", k) from e

        if items:
            self._batch(one, [(k, bytes(v)) for k, v in items.items()], "write")

    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        """Replace ``key`` with ``data`` if its ETag is ``expect`` (None: only if absent).
        ``journal`` is ignored: a conditional PUT is durable on its own.

        One conditional PUT (``If-None-Match: *`` or ``If-Match``), retried with backoff on
        409 ConditionalRequestConflict. A PUT whose answer is lost and that the client
        retries can report a lost condition against its own write: callers that must tell
        these apart stamp their data with a write id. ETags hash the content, so writing
        the same bytes again keeps the token: a rival holding it still wins (a write id in
        the data also prevents that).

        Returns:
            The new ETag (quoted).

        Raises:
            PreconditionFailed: the key is not in the expected state.
            StorageError: S3 failed; the write may or may not have landed.
        """
        cond = {"IfNoneMatch": "*"} if expect is None else {"IfMatch": _quote(expect)}
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                resp = self._run(self._put, key, bytes(data), **cond)
                break
            except Exception as e:
                code, status = _code(e)
                if (
                    code == "PreconditionFailed"
                    or status == 412
                    or (not code and expect is None and isinstance(e, FileExistsError))
                    or (expect is not None and self._missing(e))  # If-Match on an absent key: 404
                ):
                    raise PreconditionFailed(key, expect) from e
                if (code == "ConditionalRequestConflict" or status == 409) and attempt + 1 < CONFLICT_ATTEMPTS:
                    time.sleep(min(0.05 * 2**attempt, 1.0) * (0.5 + random.random()))
                    continue
                raise self._error(e, "conditional write", key) from e
        etag = resp.get("ETag")
        if etag:
            return _quote(etag)
        try:  # the server did not return the ETag: ask for it (a rival may have written since)
            head = self._run(self._head, key)
        except Exception as e:
            raise self._error(e, "check", key) from e
        if head is None or not head.get("ETag"):
            raise StorageError(f"S3 gave no ETag for {self.url}/{key} after a conditional write", self.url)
        return _quote(head["ETag"])

    def delete(self, key: str, expect: Token | None = None) -> None:
        """Delete ``key``; with ``expect``, only if its ETag still is ``expect``.

        With ``expect`` this sends a HEAD to check the ETag, then DeleteObject with
        ``If-Match``. Servers that honour If-Match on delete (AWS, moto, SeaweedFS) make it
        atomic; on others a rival write between the two requests can be deleted.

        Raises:
            PreconditionFailed: ``expect`` does not match, or the key is gone.
            StorageError: S3 failed.
        """
        try:
            if expect is not None:
                head = self._run(self._head, key)
                if head is None or _quote(head.get("ETag", "")) != _quote(expect):
                    raise PreconditionFailed(key, expect)
                self._run(lambda: self._s3("delete_object", Key=self._key(key), IfMatch=_quote(expect)))
            else:
                self._run(lambda: self._s3("delete_object", Key=self._key(key)))
        except PreconditionFailed:
            raise
        except Exception as e:
            code, status = _code(e)
            if expect is not None and (code == "PreconditionFailed" or status == 412 or self._missing(e)):
                raise PreconditionFailed(key, expect) from e
            if expect is None and self._missing(e):
                return
            raise self._error(e, "delete", key) from e

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete several keys with one DeleteObjects request per :data:`DELETE_BATCH` keys
        (missing keys are not an error, as S3 reports them deleted).

        s3fs's ``rm([...])`` batches the same way but lists each path first and drops the
        per-key errors of the answer; this sends the request itself and reads them.

        Raises:
            InvalidName: a key is not a valid storage key (nothing is deleted).
            DeleteIncomplete: a request failed, or S3 refused some keys; ``remaining`` names
                the keys that may still be stored.
        """
        todo = [check_key(k) for k in dict.fromkeys(keys)]
        full = {self._key(k): k for k in todo}
        for i in range(0, len(todo), DELETE_BATCH):
            chunk = todo[i:i + DELETE_BATCH]
            objects = [{"Key": self._key(k)} for k in chunk]
            try:
                resp = self._run(lambda o=objects: self._s3("delete_objects", Delete={"Objects": o, "Quiet": True}))
            except Exception as e:
                reason = str(self._error(e, "delete", f"({len(chunk)} keys)"))
                raise DeleteIncomplete(self.url, todo[i:], reason) from e
            errors = [err for err in resp.get("Errors") or [] if err.get("Code") not in _MISSING]
            if errors:
                failed = [full.get(err.get("Key", ""), err.get("Key", "")) for err in errors]
                first = errors[0]
                reason = f"S3 refused {len(errors)} key(s): {first.get('Code', '?')}: {first.get('Message', '')}"
                raise DeleteIncomplete(self.url, failed + todo[i + DELETE_BATCH:], reason)

    # ---------------------------------------------------------------- listing

    async def _list(self, prefix: str, delimiter: str | None) -> tuple[list[str], list[str]]:
        """(object keys, common prefixes) under ``prefix``, fresh from S3, all pages."""
        full = self._key(prefix)
        full = f"{full}/" if full else ""
        keys: list[str] = []
        dirs: list[str] = []
        kw: dict[str, Any] = {"Prefix": full}
        if delimiter:
            kw["Delimiter"] = delimiter
        while True:
            resp = await self._s3("list_objects_v2", **kw)
            keys += [o["Key"][len(full) :] for o in resp.get("Contents", [])]
            dirs += [p["Prefix"][len(full) :].rstrip("/") for p in resp.get("CommonPrefixes", [])]
            if not resp.get("IsTruncated") or not resp.get("NextContinuationToken"):
                return keys, dirs
            kw["ContinuationToken"] = resp["NextContinuationToken"]

    def list(self, prefix: str) -> list[str]:
        """List every key below the folder ``prefix`` (recursive), relative to the root, sorted.

        Raises:
            StorageError: S3 failed, or the bucket does not exist.
        """
        try:
            keys, _ = self._run(self._list, prefix, None)
        except Exception as e:
            raise self._error(e, "list", prefix) from e
        p = prefix.strip("/")
        return sorted(f"{p}/{k}" if p else k for k in keys if k and not k.endswith("/"))

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """List the immediate children (files and folders) of the folder ``prefix``, sorted.

        Returns an empty list when the folder does not exist.

        Raises:
            StorageError: S3 failed, or the bucket does not exist.
        """
        try:
            keys, dirs = self._run(self._list, prefix, "/")
        except Exception as e:
            raise self._error(e, "list", prefix) from e
        return sorted({n for n in keys + dirs if n and "/" not in n})

    # ---------------------------------------------------------------- the bucket

    def bucket_exists(self) -> bool:
        """Whether the bucket exists and answers (one HEAD on the bucket).

        Raises:
            StorageError: S3 failed (unreachable, access denied).
        """
        try:
            self._run(lambda: self._s3("head_bucket"))
            return True
        except Exception as e:
            code, status = _code(e)
            if code in ("NoSuchBucket", "404", "NotFound") or status == 404:
                return False
            raise self._error(e, "check bucket", None) from e

    def create_bucket(self) -> bool:
        """Create the bucket (in the client's region); return False if it already was there.

        Raises:
            StorageError: S3 refused (access denied, a name owned by someone else, unreachable).
        """

        async def create() -> Any:
            client = await self._fs.get_s3(self.bucket)
            region = client.meta.region_name
            kw: dict[str, Any] = {}
            if region and region != "us-east-1":  # S3 wants the region named, except the default one
                kw["CreateBucketConfiguration"] = {"LocationConstraint": region}
            return await self._s3("create_bucket", **kw)

        try:
            self._run(create)
            return True
        except Exception as e:
            code, _ = _code(e)
            if code == "BucketAlreadyOwnedByYou":
                return False
            if code == "BucketAlreadyExists":
                raise StorageError(f"bucket {self.bucket!r} is taken at {self.endpoint} (owned by another account): "
                                   "choose another name", self.url) from e
            raise self._error(e, "create bucket", None) from e

    def close(self) -> None:
        """Close the S3 client and its connections (a child's: only its own hooks)."""
        if not self._owner:
            self._hooked.clear()
            return
        fs = self._fs
        creator = getattr(fs, "_s3creator", None)
        # s3fs keeps its client private and offers no close: end it the way s3fs itself does
        if fs._s3 is not None and creator is not None:  # noqa: SLF001
            try:
                sync(fs.loop, creator.__aexit__, None, None, None, timeout=5)
            except Exception:  # noqa: BLE001 - closing is best effort: a dead connection must not fail close()
                pass
        fs._s3 = None  # noqa: SLF001
        self._hooked.clear()
