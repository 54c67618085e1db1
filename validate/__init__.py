"""validate: real execution. What it is: replay a Program on real hardware with
torch.distributed, measure, calibrate the simulator and compare.

This is the only package that imports torch, and only inside the modules that run
ranks (replay, kernels, microbench, worker, env_info), never at ``import validate``:
the simulator runs without torch, and calibration and comparison need none.

Modules, one job each:

* ``examples`` -- built-in example Programs (``tiny``: pp 2 x dp 2 transformer);
* ``program_io`` -- Programs as JSON files;
* ``launch`` / ``worker`` -- start N local ranks, or join torchrun / srun; run one rank;
* ``replay`` / ``kernels`` -- execute a rank's ops and time them;
* ``microbench`` -- collectives (nccl-tests columns), GEMM and copy sweeps;
* ``store`` -- append-only, atomic measurement files per rank (resume);
* ``env_info`` -- versions, GPUs, hosts, ``nvidia-smi topo -m``;
* ``spans`` -- measured timelines beside their Program;
* ``nccl_log`` -- nccl-tests stdout and the shared CSV tables;
* ``calibrate`` -- fit the hardware model, write a calibration file;
* ``compare`` -- simulate what a directory measured, report the error;
* ``published`` / ``published_stacks`` / ``published_memory`` / ``published_report`` /
  ``calibrate_published`` -- published training runs (``data/published``) simulated as
  their frameworks ran them, the error tables, the memory check, each preset's one
  calibrated number.

What it exports: nothing at package level; import the module you need. ``import
validate`` loads no submodule and no torch.

What it must not import: ``trainsim`` (the application layer on top, whose
``validate``/``calibrate`` commands import this package inside their functions); of
this repository only ``hardware``, ``strategies`` and ``sim`` (tests/test_layering.py).
"""
