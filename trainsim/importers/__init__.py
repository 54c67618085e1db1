"""Enter a real job as it ran: its Megatron-LM arguments or its NeMo configuration.

* :mod:`~trainsim.importers.megatron_args`: a Megatron-LM command line (or ``@FILE``);
* :mod:`~trainsim.importers.nemo_config`: a NeMo 1 launcher training YAML, or a NeMo 2 /
  Megatron-Bridge recipe configuration dumped as YAML;
* :mod:`~trainsim.importers.megatron_config`: the one mapping both use, from Megatron-LM
  settings (:mod:`~trainsim.importers.job`) to ParallelPlan fields, with Megatron's own
  defaults; :mod:`~trainsim.importers.megatron_model` makes the ModelSpec;
* :mod:`~trainsim.importers.setting_kinds`: the settings without effect (listed as
  ignored), those trainsim cannot model (refused) and those it approximates;
  :mod:`~trainsim.importers.megatron_flags`: how Megatron-LM parses each flag;
* :mod:`~trainsim.importers.patterns`: Megatron's layer-pattern and pipeline-layout
  strings; :mod:`~trainsim.importers.planning`: an imported job as ``trainsim plan``'s
  starting point.

:func:`import_job` is the entry point the scenario resolution (``trainsim.resolve``) and
the commands use.
"""

from __future__ import annotations

import os
from typing import Sequence

from strategies.model_spec import ModelSpec
from trainsim.importers.job import ImportedJob, Setting, Settings
from trainsim.importers.megatron_config import job_from_settings

__all__ = ["ImportedJob", "Setting", "Settings", "import_job"]


def import_job(*, megatron_args: str | Sequence[str] | None = None,
               nemo_config: str | os.PathLike[str] | None = None, gpus: int | None = None,
               model: ModelSpec | None = None,
               base_dir: str | os.PathLike[str] | None = None) -> ImportedJob:
    """The model and plan fields of a job's Megatron-LM arguments or NeMo YAML.

    Args:
        megatron_args: the arguments as one string, ``@FILE`` or a list of words.
        nemo_config: path of a NeMo 1 launcher / NeMo 2 / Megatron-Bridge YAML.
        gpus: GPUs of the job, when given apart from the job (``--gpus``).
        model: a model given apart from the job: it replaces the job's own shape.
        base_dir: relative paths are relative to it.

    Raises:
        ValueError: not exactly one of ``megatron_args`` and ``nemo_config``, or one line
            naming the setting that is unknown, refused or invalid.
    """
    if (megatron_args is None) == (nemo_config is None):
        raise ValueError("import: give one of megatron_args (--megatron-args) or nemo_config "
                         "(--nemo-config)")
    if megatron_args is not None:
        from trainsim.importers.megatron_args import settings_from_arguments

        settings = settings_from_arguments(megatron_args, base_dir=base_dir)
    else:
        from trainsim.importers.nemo_config import settings_from_nemo

        settings = settings_from_nemo(nemo_config, base_dir=base_dir)
    return job_from_settings(settings, gpus=gpus, model=model)
