"""Python API: the same answers as the CLI, as pandas objects.

Example (Jupyter)::

    from sim import api
    df = api.collective("all_reduce", cluster="dgx-h100", nodes=2, gpus_per_node=8)
    df.plot(x="size_bytes", y="busbw_GBps", logx=True)
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from hardware.catalog import cluster_to_dict, list_presets, load_cluster
from hardware.spec import ClusterSpec
from hardware.units import parse_size_bytes
from sim.collective_bench import collective_sweep, sweep_sizes


def resolve_cluster(cluster: str | ClusterSpec,
                    overrides: Mapping[str, object] | None = None) -> ClusterSpec:
    """A preset name, a preset file path or a ClusterSpec, with overrides applied.

    Raises:
        ValueError: for an unknown preset or a bad override (one line naming it).
    """
    if isinstance(cluster, ClusterSpec):
        if overrides:
            raise ValueError("overrides: give a preset name or path to apply overrides to, "
                             "not a ClusterSpec (use dataclasses.replace on the spec)")
        return cluster
    return load_cluster(cluster, overrides)


def collective(op: str, *, cluster: str | ClusterSpec = "dgx-h100", nodes: int = 1,
               gpus_per_node: int | None = None, algorithm: str = "auto",
               min_bytes: int | str = 8, max_bytes: int | str = "16GiB", step_factor: int = 2,
               fidelity: str = "analytic", dtype: str = "float",
               overrides: Mapping[str, object] | None = None, on_row=None) -> pd.DataFrame:
    """Simulate an nccl-tests sweep of one collective over all GPUs of the job.

    Args:
        op: all_reduce, all_gather, reduce_scatter, alltoall, broadcast,
            reduce or sendrecv.
        cluster: preset name, preset file, or spec.
        nodes: nodes in the job.
        gpus_per_node: GPUs used per node (default: all of the preset's).
        algorithm: ``auto``, ``ring``, ``tree``, ``nvls``, ``hierarchical``
            (all_reduce) or ``direct`` (alltoall, sendrecv).
        min_bytes, max_bytes: sweep bounds in bytes or with a suffix ("16GiB").
        step_factor: multiply the size by this each step (nccl-tests -f).
        fidelity: ``analytic`` or ``flow``.
        dtype: nccl-tests type name for the count column.
        overrides: dotted preset keys to change, e.g. ``{"nic.gbit_per_s": 200}``.
        on_row: callback receiving each row as it is computed.

    Returns:
        DataFrame with nccl-tests' columns (see :mod:`sim.collective_bench`).

    Raises:
        ValueError: one line naming the bad field, its value and what is valid.
    """
    spec = resolve_cluster(cluster, overrides)
    sizes = sweep_sizes(parse_size_bytes(min_bytes, field="min-bytes"),
                        parse_size_bytes(max_bytes, field="max-bytes"), step_factor)
    return collective_sweep(op, spec, nodes=nodes,
                            gpus_per_node=spec.gpus_per_node if gpus_per_node is None
                            else gpus_per_node,
                            sizes=sizes, algorithm=algorithm, fidelity=fidelity, dtype=dtype,
                            on_row=on_row)


def hardware_list() -> pd.DataFrame:
    """Built-in presets with their headline numbers (one row each)."""
    rows = []
    for name in list_presets():
        spec = load_cluster(name)
        rows.append({
            "name": name,
            "gpu": spec.gpu.name,
            "gpus_per_node": spec.gpus_per_node,
            "nvlink_domain_gpus": spec.scale_up.domain_gpus,
            "nvlink_GBps_per_gpu": spec.scale_up.nvlink_bytes_per_s / 1e9,
            "nvls": spec.scale_up.nvls,
            "nics_per_node": spec.nic.count_per_node,
            "nic_Gbps": spec.nic.gbit_per_s,
            "nic_kind": spec.nic.kind,
            "fabric": spec.fabric.topology,
            "description": spec.description,
        })
    return pd.DataFrame(rows)


def hardware_show(cluster: str, overrides: Mapping[str, object] | None = None) -> dict:
    """Every field of a preset (after overrides), JSON-serialisable."""
    return cluster_to_dict(load_cluster(cluster, overrides))
