"""What the run was on: machine, load, versions."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys

PACKAGES = ("castore", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langchain-core",
            "msgspec", "blake3", "zstandard", "s3fs", "moto")


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gb() -> float | None:
    """Total memory in GiB from /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def uptime() -> str:
    """The output of ``uptime`` (load averages), or the load from os.getloadavg()."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def filesystem(path: str) -> str:
    """The file system type and device holding ``path`` (from /proc/mounts)."""
    best = ("", "?", "?")
    try:
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, fstype, dev)
    except OSError:
        pass
    return f"{best[1]} on {best[2]}"


def versions() -> dict[str, str]:
    """Python and the packages that matter, as installed."""
    out = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = "not installed"
    return out


def describe(workdir: str) -> dict[str, str]:
    """Machine facts for the report."""
    mem = memory_gb()
    return {
        "cpus": str(os.cpu_count()),
        "cpu model": cpu_model(),
        "memory": f"{mem:.1f} GiB" if mem else "unknown",
        "os": f"{platform.system()} {platform.release()}",
        "work folder": f"{workdir} ({filesystem(workdir)})",
    }
