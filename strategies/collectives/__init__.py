"""Collective algorithms as data: which transfers each rank makes, in which phases.

What it is: the algorithm builders (``algorithms``: ring, double binary tree, NVLS,
hierarchical, direct all-to-all, point-to-point), the plans they produce (``plans``:
:class:`Transfer`, :class:`Phase`, :class:`CommPlan`) and the catalog that names the
candidates for each collective kind (``catalog``: :data:`ALGORITHMS`,
``valid_algorithms``).

What it exports: nothing at package level; import the module you need. Durations are
not computed here: the hardware cost model (:mod:`hardware.cost`) prices a plan and picks
the fastest candidate.

What it must not import: ``sim``, ``trainsim``, ``validate``, and of ``hardware`` only
``spec`` and ``units`` (tests/test_layering.py).
"""
