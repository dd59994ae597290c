"""A local Ray instance for one search, and the clean-up of one whose driver was killed.

A driver killed with SIGKILL takes Ray's head processes with it, but the agents its raylet
started (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) stay alive, orphaned, for good. So every
local instance started here is recorded (the driver's pid and start time, and Ray's session
directory) in a per-user directory, and every start first reaps the sessions whose driver is
gone: it kills the processes that still hold files open in the session's directory (Ray's own
logs, so nothing else does). Linux only (it reads /proc); elsewhere nothing is recorded.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["RECORDS", "reap_orphaned_sessions", "session_processes", "start_local_ray", "stop_local_ray"]

#: Where the local instances of this user's drivers are recorded, one `<driver pid>.json` each.
RECORDS = Path(tempfile.gettempdir()) / f"einspace-{os.getuid()}" / "ray-sessions"
_PROC = Path("/proc")


def _start_time(pid: int) -> int | None:
    """The start time of a live process (clock ticks after boot), None for a dead one or a zombie:
    with the pid it names a process, so a recycled pid is never mistaken for the recorded one."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces; fields after it do not
    return None if fields[0] in ("Z", "X") else int(fields[19])


def session_processes(session_dir: str) -> list[int]:
    """Live processes (other than this one) holding a file open inside `session_dir`."""
    prefix = session_dir.rstrip("/") + "/"
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(t.startswith(prefix) for t in targets):
            found.append(int(entry.name))
    return found


def reap_orphaned_sessions(records: Path = RECORDS) -> list[int]:
    """Kill what is left of every recorded local instance whose driver has died; the pids killed."""
    if not records.is_dir():
        return []
    killed = []
    for path in records.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written by a driver that is starting right now
        if _start_time(record["pid"]) == record["start"]:
            continue  # its driver is alive
        for pid in session_processes(record["session_dir"]):
            if pid in killed:
                continue  # two records of one session: killed already, maybe not yet gone
            try:
                os.kill(pid, signal.SIGKILL)  # orphans of a dead session ignore SIGTERM
                killed.append(pid)
            except ProcessLookupError:
                pass
        path.unlink(missing_ok=True)
    return killed


def start_local_ray(**init_options: Any) -> None:
    """`ray.init(address="local", ...)`: a fresh instance for this driver, never a cluster found
    lying around, after reaping what crashed drivers left; recorded until `stop_local_ray`."""
    import ray

    if _PROC.is_dir():
        reap_orphaned_sessions()
    context = ray.init(address="local", include_dashboard=False, log_to_driver=False, **init_options)
    start = _start_time(os.getpid())
    if start is None:
        return
    RECORDS.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "start": start, "session_dir": context.address_info["session_dir"]}
    tmp = RECORDS / f".{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, RECORDS / f"{os.getpid()}.json")


def stop_local_ray() -> None:
    """Shut the instance down and forget its record."""
    import ray

    ray.shutdown()
    (RECORDS / f"{os.getpid()}.json").unlink(missing_ok=True)
