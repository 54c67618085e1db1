"""The text syntax of stragglers and heterogeneity (strategies.perturbations), shared by
the command line and scenario files.

``--straggler RANK:SPEED``, ``--thermal RANK:START_S:DURATION_S:SPEED``,
``--degraded-nic RANK:FRACTION``, ``--flapping-link RANK:UP_S:DOWN_S`` and
``--node-gpu NODE:PRESET``, each repeatable; in a scenario file, a list of such strings
per key (``straggler = ["5:0.5"]``). A malformed value raises a one-line ValueError
naming the option and the expected form. :func:`format_perturbations` is the inverse
(floats written with ``repr``, so parsing them back gives the same numbers).
"""

from __future__ import annotations

from typing import Callable, Sequence

from strategies.perturbations import FlappingLink, Perturbations, ThermalEpisode


def _fields(option: str, text: str, form: str, example: str,
            kinds: Sequence[Callable[[str], object]]) -> list:
    parts = text.split(":")
    try:
        if len(parts) != len(kinds):
            raise ValueError
        return [kind(part) for kind, part in zip(kinds, parts)]
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not valid; give {form}, e.g. {example}") from None


def parse_perturbations(*, straggler: Sequence[str] = (), thermal: Sequence[str] = (),
                        degraded_nic: Sequence[str] = (), flapping_link: Sequence[str] = (),
                        node_gpu: Sequence[str] = ()) -> Perturbations:
    """The Perturbations the options describe.

    Raises:
        ValueError: one line naming the option, the value and the expected form.
    """
    slow = {}
    for text in straggler or ():
        rank, speed = _fields("straggler", text, "RANK:SPEED", "5:0.5", (int, float))
        slow[rank] = speed
    episodes = tuple(ThermalEpisode(*_fields("thermal", text, "RANK:START_S:DURATION_S:SPEED",
                                             "5:0.2:1.5:0.6", (int, float, float, float)))
                     for text in thermal or ())
    nics = {}
    for text in degraded_nic or ():
        rank, fraction = _fields("degraded-nic", text, "RANK:FRACTION", "12:0.5", (int, float))
        nics[rank] = fraction
    flapping = tuple(FlappingLink(*_fields("flapping-link", text, "RANK:UP_S:DOWN_S",
                                           "12:30:3", (int, float, float)))
                     for text in flapping_link or ())
    gpus = {}
    for text in node_gpu or ():
        node, preset = _fields("node-gpu", text, "NODE:PRESET", "3:dgx-a100", (int, str))
        gpus[node] = preset
    return Perturbations(slow_ranks=slow, thermal=episodes, degraded_nics=nics,
                         flapping_links=flapping, node_gpus=gpus)


#: The options (and scenario keys) of :func:`parse_perturbations`, in order.
PERTURBATION_OPTIONS = ("straggler", "thermal", "degraded_nic", "flapping_link", "node_gpu")


def format_perturbations(perturbations: Perturbations) -> dict[str, list[str]]:
    """``{option: [text, ...]}`` that :func:`parse_perturbations` turns back into
    ``perturbations``; options without entries are left out."""
    text = {
        "straggler": [f"{r}:{s!r}" for r, s in sorted(perturbations.slow_ranks.items())],
        "thermal": [f"{e.rank}:{e.start_s!r}:{e.duration_s!r}:{e.speed!r}"
                    for e in perturbations.thermal],
        "degraded_nic": [f"{r}:{f!r}" for r, f in sorted(perturbations.degraded_nics.items())],
        "flapping_link": [f"{f.rank}:{f.up_s!r}:{f.down_s!r}"
                          for f in perturbations.flapping_links],
        "node_gpu": [f"{n}:{p}" for n, p in sorted(perturbations.node_gpus.items())],
    }
    return {option: entries for option, entries in text.items() if entries}
