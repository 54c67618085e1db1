"""Worker processes that never outlive the process that started them.

A sweep's pool workers and a replay's ranks are started by one trainsim process. When
that process is killed (SIGKILL, the OOM killer, a closed terminal), its workers must go
too: left running they hold memory and cores, and a rerun measured beside them reads
their load as data. :func:`die_with_parent` (call it first thing in the child) asks
Linux to send the child SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and
exits at once if the parent already died before the request was made. Elsewhere it does
nothing: those platforms keep the old behaviour.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

#: prctl option of Linux's <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> bool:
    """Make this (child) process receive SIGKILL when its parent exits.

    Args:
        parent_pid: the pid of the parent that started this process, read by the parent
            before it started the child (so a parent that already died is noticed).

    Returns:
        True when the kernel will kill this process with its parent (Linux), else False.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent died before prctl: nobody would kill us
        os._exit(1)
    return True
