"""Real processes for tests and benchmarks that read /proc: idle children of this one."""

from __future__ import annotations

import os


def spawn_idle(count: int) -> tuple[list[int], int]:
    """Fork count children that wait for EOF on a pipe; returns (pids, write end)."""
    r, w = os.pipe()
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # the child: block until the parent closes the pipe (or dies)
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        pids.append(pid)
    os.close(r)
    return pids, w


def end_idle(pids: list[int], w: int) -> None:
    """Let the children of spawn_idle exit, and reap them."""
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
