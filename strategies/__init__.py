"""strategies: what a training step does, never how long it takes.

What it is: model specs and presets (``model_spec``, ``models``), parallel plans and rank
layouts (``plan``), the Program IR and its checks (``ir``, ``program_check``), collective
algorithms as transfer steps (``collectives``), pipeline schedules as per-rank action
lists (``pipeline``), the memory model (``memory``), kernel costs (``model_costs``), the
lowering of a step into a Program (``lowering``), parameter-server modes
(``param_server``), stragglers and heterogeneity (``perturbations``) and the failure and
checkpoint policies of long runs (``failures``, ``failure_profiles``).

What it exports: nothing at package level. Import the module you need
(``from strategies.plan import ParallelPlan``); ``import strategies`` loads no submodule.

What it must not import: ``sim``, ``validate``, ``trainsim`` and torch; of this
repository only ``hardware`` (tests/test_layering.py).
"""
