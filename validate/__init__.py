"""Real execution: replay a Program on GPUs with torch.distributed and calibrate.

This is the only package that may import torch, and only inside its own
modules (never at ``import validate``), so the simulator runs without torch.
The runner, microbenchmarks and calibration arrive with issue 6; nothing here
is importable yet beyond this docstring.
"""
