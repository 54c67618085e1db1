"""The defaults every entry point shares: ``import trainsim``, every command, sweeps, plan.

One policy, applied by :func:`resolve_plan_fields` (the API's ``make_plan``, the commands,
sweeps and scenario files all call it) and printed in every command's header:

* **sequence length** :data:`SEQ_LEN` = 4,096 tokens;
* **global batch**: about :data:`TOKENS_PER_STEP` = 4 Mi tokens per step (Llama 3 405B
  started at 4M tokens, GPT-3 175B used 3.2M): the power of two nearest
  ``TOKENS_PER_STEP / seq_len`` sequences, and at least one sequence per 8 GPUs
  (:func:`global_batch`). ``trainsim plan`` uses that number for every candidate; one
  plan (simulate, failures, a sweep) rounds it to the nearest whole number of
  ``dp x micro_batch`` sequences (``x pp`` for the interleaved schedule) when it does
  not divide, so a power-of-two job gets the same batch from every entry point;
* **dp** = gpus / (tp x pp x cp); **micro-batch** 1;
* **ZeRO** stage 1, or 0 with a parameter-server ``dp_mode`` (the servers hold the
  optimizer state);
* **schedule** 1F1B, or interleaved when ``vpp`` > 1 (as Megatron-LM does);
* every other plan field: its :class:`strategies.plan.ParallelPlan` default (sequence
  parallelism and flash attention on, gradient reduction overlapped with the backward
  pass in 40 MB buckets);
* **cluster** :data:`CLUSTER`; no calibration;
* **long run** (``failures``): :data:`FAILURES` (failure profile ``llama3-h100``,
  checkpoint interval ``auto``, synchronous saves, 100 seeds from seed 0);
* **fidelity**, per question: a step (``simulate``) is replayed op by op
  (:data:`STEP_FIDELITY`); the step under a long run (``failures``) and a sweep's steps
  use the closed form (:data:`FAILURES_FIDELITY`, :data:`SWEEP_FIDELITY`); a collective
  sweep is closed-form (:data:`COLLECTIVE_FIDELITY`); ``plan`` ranks at ``analytic``
  and confirms at ``event``.

``ParallelPlan``'s own field defaults (e.g. ``seq_len`` 2048, ``global_batch`` 1) are
those of a bare dataclass for library code; no entry point of this package uses them for
the sequence length or the batch.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

#: Cluster preset when none is given.
CLUSTER = "dgx-h100"
#: Tokens per sequence when none is given.
SEQ_LEN = 4096
#: Tokens per step the default global batch aims at: 4 Mi tokens.
TOKENS_PER_STEP = 4 * 2**20
#: ZeRO stage when none is given (0 for parameter-server training).
ZERO = 1
#: Fidelity of ``trainsim simulate`` / :func:`trainsim.simulate`.
STEP_FIDELITY = "event"
#: Fidelity of the step simulated before a long run (``trainsim failures``).
FAILURES_FIDELITY = "analytic"
#: Inputs of the long run of ``trainsim failures`` when not given (days or tokens have
#: no default: give exactly one).
FAILURES = {"profile": "llama3-h100", "checkpoint_interval": "auto", "checkpoint_mode": "sync",
            "seeds": 100, "seed": 0}
#: Fidelity of a sweep's steps (kind ``step``).
SWEEP_FIDELITY = "analytic"
#: Fidelity of ``trainsim collective`` and a sweep's collectives.
COLLECTIVE_FIDELITY = "analytic"
#: The schedule Megatron-LM uses with virtual pipeline stages.
INTERLEAVED = "interleaved"
#: The schedule without virtual stages.
SCHEDULE = "1f1b"


def global_batch(seq_len: int, gpus: int, *, unit: int = 1) -> int:
    """Sequences per step when none is given (module docstring).

    Args:
        seq_len: tokens per sequence (>= 1).
        gpus: GPUs of the job (>= 1).
        unit: the batch must be a multiple of this (dp x micro_batch, x pp for the
            interleaved schedule); 1 for the planner's shared batch.

    Returns:
        ~:data:`TOKENS_PER_STEP` tokens as a power of two of sequences, at least
        ``gpus / 8``; rounded to the nearest positive multiple of ``unit``.
    """
    target = max(1, TOKENS_PER_STEP // seq_len, gpus // 8)
    batch = 2 ** max(0, round(math.log2(target)))
    if batch % unit:
        batch = max(1, round(batch / unit)) * unit
    return batch


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: {value!r} is not valid; give a whole number >= 1")
    return value


def resolve_plan_fields(fields: Mapping[str, Any], *, gpus: int | None = None) -> dict[str, Any]:
    """The plan fields a user gave, completed with the defaults (module docstring).

    Args:
        fields: plan fields given (None values count as not given).
        gpus: GPUs of the job (workers, for parameter servers); None: dp defaults to 1.

    Returns:
        Keyword arguments for :class:`strategies.plan.ParallelPlan`.

    Raises:
        ValueError: when gpus, tp, pp, cp or micro_batch is not a whole number >= 1, or
            gpus is not divisible by tp x pp x cp (one line naming the field).
    """
    values = {k: v for k, v in fields.items() if v is not None}
    if gpus is not None:
        _positive("gpus", gpus)
    tp, pp, cp, micro_batch = (_positive(k, values.get(k, 1))
                               for k in ("tp", "pp", "cp", "micro_batch"))
    if "dp" not in values:
        if gpus is None:
            values["dp"] = 1
        elif gpus % (tp * pp * cp):
            raise ValueError(f"gpus: {gpus} is not divisible by tp {tp} x pp {pp} x cp {cp} = "
                             f"{tp * pp * cp}; give dp, or a GPU count that divides")
        else:
            values["dp"] = gpus // (tp * pp * cp)
    dp = _positive("dp", values["dp"])
    values.setdefault("seq_len", SEQ_LEN)
    if "schedule" not in values:
        vpp = values.get("vpp", 1)
        values["schedule"] = INTERLEAVED if isinstance(vpp, int) and vpp > 1 else SCHEDULE
    if "global_batch" not in values:
        unit = dp * micro_batch * (pp if values["schedule"] == INTERLEAVED else 1)
        values["global_batch"] = global_batch(_positive("seq_len", values["seq_len"]),
                                              dp * tp * pp * cp, unit=unit)
    if "zero" not in values:
        values["zero"] = ZERO if values.get("dp_mode", "allreduce") == "allreduce" else 0
    return values
