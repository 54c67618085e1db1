"""hardware: what the machine is and how long work takes on it.

What it is: frozen specifications with units in their names (``spec``), the preset
catalog of TOML files with a source for every number (``catalog``), calibration files
(``calibration``), unit parsing (``units``), where every GPU sits and which links a
transfer crosses (``topology``), the compute model (``compute``) and the network models
at two fidelities behind one interface (``network``: closed-form alpha-beta; ``flow``:
max-min fair sharing of links).

What it exports: nothing at package level. Import the module you need
(``from hardware.catalog import load_cluster``); ``import hardware`` loads no submodule.

What it must not import: any other package of this repository (``strategies``, ``sim``,
``validate``, ``trainsim``) and never torch. It is the bottom layer
(tests/test_layering.py).
"""
