"""What checkpoints and restarts cost a job, in seconds (strategies.failures' policy,
priced by the hardware cost model's storage and host-copy terms).

``sync`` saves block training for ``checkpoint_fixed_s + bytes / min(write_per_node x
nodes, write_total)``; ``async`` blocks only for ``checkpoint_fixed_s + (bytes / gpus) /
(pcie x snapshot_pcie_efficiency)`` and uploads in the background in the sync save's
time; a restart reloads at ``bytes / min(read_per_node x nodes, read_total)``
(strategies.failures, module docstring).
"""

from __future__ import annotations

import math

from hardware.cost import host_copy_s, storage_transfer_s
from hardware.spec import ClusterSpec
from strategies.failures import CHECKPOINT_MODES, CheckpointCosts, JobUnits, Responses


def checkpoint_costs(*, checkpoint_bytes: int, mode: str, units: JobUnits, cluster: ClusterSpec,
                     responses: Responses) -> CheckpointCosts:
    """Save, upload and reload times of a checkpoint (module docstring).

    Raises:
        ValueError: for a bad mode or a negative size.
    """
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint_mode: {mode!r} is not valid; valid: "
                         f"{', '.join(CHECKPOINT_MODES)}")
    if not isinstance(checkpoint_bytes, (int, float)) or not 0 <= checkpoint_bytes < math.inf:
        raise ValueError(f"checkpoint_bytes: {checkpoint_bytes!r} is not valid; give a size "
                         ">= 0 bytes")
    size = float(checkpoint_bytes)
    r = responses
    write_s = storage_transfer_s(size, nodes=units.nodes,
                                 per_node_bytes_per_s=r.storage_write_bytes_per_s_per_node,
                                 total_bytes_per_s=r.storage_write_bytes_per_s_total)
    read_s = storage_transfer_s(size, nodes=units.nodes,
                                per_node_bytes_per_s=r.storage_read_bytes_per_s_per_node,
                                total_bytes_per_s=r.storage_read_bytes_per_s_total)
    if mode == "sync":
        blocking, upload = r.checkpoint_fixed_s + write_s, 0.0
    else:
        snapshot_s = host_copy_s(size, gpus=units.gpus,
                                 pcie_bytes_per_s=cluster.scale_up.pcie_bytes_per_s,
                                 efficiency=r.snapshot_pcie_efficiency)
        blocking, upload = r.checkpoint_fixed_s + snapshot_s, write_s
    if r.checkpoint_blocking_s is not None:
        blocking = r.checkpoint_blocking_s
    if r.checkpoint_upload_s is not None:
        upload = r.checkpoint_upload_s if mode == "async" else 0.0
    reload = r.reload_s if r.reload_s is not None else read_s
    return CheckpointCosts(checkpoint_bytes=int(size), mode=mode, blocking_s=blocking,
                           upload_s=upload, reload_s=reload, restart_s=r.reinit_s + reload,
                           detection_s=r.detection_s)
