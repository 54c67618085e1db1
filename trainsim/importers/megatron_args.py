"""A Megatron-LM command line -> :class:`~trainsim.importers.job.Settings`.

What it reads:

* the arguments themselves (``--tensor-model-parallel-size 8 --bf16 ...``), as shell
  words: quotes, ``#`` comments and ``\\``-newline continuations as a shell reads them;
* ``@FILE``: the same from a file; a ``.yaml``/``.yml`` file may instead hold a mapping
  of flags (the Megatron-MoE ModelZoo's ``MODEL_ARGS:`` files): ``true`` means the bare
  flag, ``false`` leaves it out (as the ModelZoo's ``sbatch_benchmarking.sh`` turns them
  into arguments);
* a whole launch line: ``torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py ...`` or
  ``python -m torch.distributed.launch ...``: the launcher's ``nproc_per_node x nnodes``
  is the GPU count, the words after the ``.py`` script are Megatron's; ``KEY=VALUE``
  environment words before the command are skipped.

Each flag is parsed as Megatron-LM's ``argparse`` does (:mod:`~trainsim.importers.
megatron_flags`: ``--flag value``, ``--flag=value``, several values for list flags, the
last occurrence wins). A flag trainsim does not know is refused; one without effect on
step time or memory is kept in the list of ignored settings. Shell variables (``$TP``,
``${TP}``) are not expanded: they are refused, naming the flag.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Sequence

from hardware.user_input import MAX_TEXT_BYTES, load_input, read_input_text
from trainsim.importers.job import Setting, Settings
from trainsim.importers.setting_kinds import is_ignored
from trainsim.importers.megatron_flags import FLAGS, Flag, destination

__all__ = ["canonical_arguments", "read_arguments", "relative_files", "settings_from_arguments"]

_VARIABLE = re.compile(r"\$\{?\w+\}?")
#: torchrun / torch.distributed.launch options that give the GPU count.
_NPROC = ("--nproc_per_node", "--nproc-per-node")
_NNODES = ("--nnodes",)
_FILE_HINT = "give a file of Megatron-LM arguments"


def read_arguments(arguments: str | Sequence[str], *,
                   base_dir: str | os.PathLike[str] | None = None) -> tuple[list[str], str]:
    """The words of a Megatron-LM command line and a label of what they are (the same with or
    without files, so a result re-run from the recorded words is bit for bit the same).

    Args:
        arguments: the command line as one string or a list of words; a word ``@FILE``
            stands for the words of that file (as argparse's ``fromfile_prefix_chars``).
        base_dir: a relative ``@FILE`` is relative to it (default: the working directory).

    Raises:
        ValueError: an unreadable file, or text that is not shell words (one line).
    """
    given = _words(arguments, "megatron-args") if isinstance(arguments, str) \
        else [str(word) for word in arguments]
    words: list[str] = []
    for word in given:
        if not word.startswith("@"):
            words.append(word)
            continue
        path = Path(word[1:]).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if path.suffix.lower() in (".yaml", ".yml"):
            words += _yaml_words(path)
        else:
            words += _words(read_input_text(path, what="megatron-args", hint=_FILE_HINT,
                                            max_bytes=MAX_TEXT_BYTES), str(path))
    return words, "Megatron-LM arguments"


def _words(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "), comments=True)
    except ValueError as problem:
        raise ValueError(f"megatron-args: {where} is not shell words ({problem})") from None


def _yaml_words(path: Path) -> list[str]:
    """Flags of a ModelZoo-style YAML (``MODEL_ARGS: {--flag: value}``)."""
    data, _ = load_input(path, what="megatron-args", hint=_FILE_HINT, syntax="yaml")
    table = data.get("MODEL_ARGS", data) if isinstance(data, dict) else None
    if not isinstance(table, dict) or not all(str(k).startswith("--") for k in table):
        raise ValueError(f"megatron-args: {path} is not a mapping of --flags (or MODEL_ARGS: "
                         "of them); give a file of Megatron-LM arguments")
    words: list[str] = []
    for flag, value in table.items():
        if value is False or value == "false":
            continue
        words.append(str(flag))
        if value is not True and value != "true":
            words += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return words


def relative_files(arguments: str, base_dir: str | os.PathLike[str] | None) -> str:
    """``arguments`` with each ``@FILE`` made absolute against ``base_dir`` (a scenario
    file's folder), so the scenario reads the same files from anywhere.

    Raises:
        ValueError: text that is not shell words (one line).
    """
    words = _words(arguments, "megatron-args")
    if base_dir is None:
        return arguments
    return shlex.join("@" + str((Path(base_dir) / Path(w[1:]).expanduser()).resolve())
                      if w.startswith("@") else w for w in words)


def canonical_arguments(arguments: str | Sequence[str], *,
                        base_dir: str | os.PathLike[str] | None = None) -> str:
    """The command line as one string of shell words (an ``@FILE`` read): what a resolved
    scenario records, so a re-run does not depend on the file.

    Raises:
        ValueError: as :func:`read_arguments`.
    """
    words, _ = read_arguments(arguments, base_dir=base_dir)
    return shlex.join(words)


def settings_from_arguments(arguments: str | Sequence[str], *,
                            base_dir: str | os.PathLike[str] | None = None) -> Settings:
    """The Settings of a Megatron-LM command line (module docstring).

    Raises:
        ValueError: one line naming the flag: unknown, a shell variable, a missing or
            extra value, a value of the wrong type.
    """
    words, source = read_arguments(arguments, base_dir=base_dir)
    words, gpus = _strip_launcher(words)
    values: dict[str, Setting] = {}
    ignored: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ValueError(f"megatron-args: {word!r} is not a flag; give Megatron-LM "
                             "arguments as --flag [value ...]")
        flag, equals, inline = word.partition("=")
        given = [inline] if equals else []
        i += 1
        while i < len(words) and not words[i].startswith("--"):
            given.append(words[i])
            i += 1
        for value in given:
            if _VARIABLE.search(value):
                raise ValueError(f"{flag}: {value!r} is a shell variable trainsim does not "
                                 "expand; give its value")
        spec = FLAGS.get(flag)
        if spec is None:
            if is_ignored(destination(flag)):
                ignored.append(flag)
                continue
            raise ValueError(f"{flag}: is not a Megatron-LM argument trainsim knows; remove it "
                             "if it has no effect on step time or memory")
        values[spec.dest] = Setting(_typed(flag, spec, given), flag)
    return Settings(values=values, source=source, ignored=tuple(ignored), gpus=gpus)


def _typed(flag: str, spec: Flag, given: list[str]) -> Any:
    """The value argparse would store for ``flag`` with the words ``given``."""
    if spec.kind in ("on", "off"):
        if given:
            raise ValueError(f"{flag}: takes no value (got {' '.join(given)!r})")
        return spec.kind == "on"
    if spec.kind == "one" and len(given) != 1:
        raise ValueError(f"{flag}: takes one value (got {len(given)})")
    converted = []
    for text in given:
        try:
            converted.append(spec.type(text))
        except ValueError:
            kind = {int: "a whole number", float: "a number"}.get(spec.type, "a value")
            raise ValueError(f"{flag}: {text!r} is not valid; give {kind}") from None
    return converted[0] if spec.kind == "one" else converted


def _strip_launcher(words: list[str]) -> tuple[list[str], int | None]:
    """The Megatron words of a launch line, and the launcher's GPU count (or None)."""
    if not words or words[0].startswith("--"):
        return words, None
    script = next((i for i, word in enumerate(words) if word.endswith(".py")), None)
    if script is None:
        raise ValueError(f"megatron-args: {words[0]!r} is not a flag and no training script "
                         "(*.py) follows; give Megatron-LM arguments as --flag [value ...]")
    launcher = [w for w in words[:script] if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w)]
    options = {}
    for i, word in enumerate(launcher):
        name, equals, inline = word.partition("=")
        if name in _NPROC + _NNODES:
            options[name] = inline if equals else (launcher[i + 1] if i + 1 < len(launcher)
                                                   else "")
    nproc = next((options[n] for n in _NPROC if n in options), None)
    nnodes = options.get("--nnodes")
    gpus = None
    if nproc is not None or nnodes is not None:
        for name, text in (("--nproc_per_node", nproc), ("--nnodes", nnodes)):
            if text is not None and not text.isdigit():
                raise ValueError(f"{name}: {text!r} is not valid; give a whole number (an "
                                 "elastic range or a variable says no GPU count)")
        gpus = int(nproc or 1) * int(nnodes or 1)
    return words[script + 1:], gpus
