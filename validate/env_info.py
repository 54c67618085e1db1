"""The software and hardware a measurement ran on (recorded with every measurement).

torch, NCCL, CUDA and driver versions, GPU names, the host name, and the output of
``nvidia-smi topo -m`` when that tool is present. Imports torch lazily.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys


def _run(command: list[str], timeout_s: float = 20.0) -> str | None:
    """stdout of a command, or None when it is missing or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def environment(backend: str | None = None, *, topology: bool = True) -> dict:
    """A JSON-serialisable description of this process's environment.

    Args:
        backend: the torch.distributed backend in use, recorded as is.
        topology: run ``nvidia-smi topo -m`` (skipped where nvidia-smi is absent).
    """
    import torch

    info: dict = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "backend": backend,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "cuda": torch.version.cuda,
        "nccl": None,
        "driver": None,
        "gpus": [],
        "nvidia_smi_topo": None,
    }
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            info["nccl"] = (".".join(map(str, version)) if isinstance(version, tuple)
                            else str(version))
        except (AttributeError, RuntimeError):
            pass
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        info["driver"] = driver.splitlines()[0].strip() if driver else None
        if topology:
            info["nvidia_smi_topo"] = _run(["nvidia-smi", "topo", "-m"])
    return info
