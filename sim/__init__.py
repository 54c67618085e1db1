"""sim: replay what strategies decided on the hardware models, and report it.

What it is: the engine that replays a Program in one SimPy environment (``engine``),
timelines and traces (``timeline``), one training step at every fidelity (``step``; the
closed form in ``analytic_step``, perturbed ranks in ``perturbed``, parameter servers in
``ps_step``), where a rank's time goes (``breakdown``), nccl-tests simulated
(``collective_bench``), the Monte-Carlo long run with failures (``longrun``) and atomic
file writes (``atomic_io``).

What it exports: nothing at package level. Import the module you need
(``from sim.step import simulate_step``); ``import sim`` loads no submodule. The
user-facing API on top of it is the ``trainsim`` package.

What it must not import: ``validate``, ``trainsim`` and torch; of this repository only
``hardware`` and ``strategies`` (tests/test_layering.py).
"""
