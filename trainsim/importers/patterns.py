"""The two small languages inside Megatron-LM arguments, read without ``eval``.

* ``--moe-layer-freq``: an integer N (one MoE layer every N, layer 0 included) or a
  Python-style list expression such as ``([0]*3+[1]*58)`` (1 = MoE layer). Megatron-LM
  evaluates it with ``eval`` after allowing only ``,``, digits, ``[]``, ``()``, ``+`` and
  ``*`` (``moe_freq_type`` in ``megatron/training/arguments.py``); here a small parser
  reads the same grammar.
* ``--pipeline-model-parallel-layout``: stages separated by ``|``, each a run of ``E``
  (embedding), ``t`` (transformer layer), ``m`` (multi-token-prediction layer) and ``L``
  (loss); ``(...)*n`` and ``X*n`` repeat; commas are cosmetic (the argument's help text
  in the same file).
"""

from __future__ import annotations

import re

__all__ = ["layer_pattern", "moe_layout", "pipeline_layout"]


class _Reader:
    """A cursor over a pattern, raising one-line errors that name the flag."""

    def __init__(self, text: str, flag: str) -> None:
        self.text, self.flag, self.at = text.replace(" ", ""), flag, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.flag}: {self.text!r} is not valid at character {self.at} "
                          f"({what})")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def take(self, char: str) -> bool:
        if self.peek() == char:
            self.at += 1
            return True
        return False

    def number(self) -> int:
        match = re.match(r"\d+", self.text[self.at:])
        if match is None:
            raise self.fail("expected a whole number")
        self.at += match.end()
        return int(match.group())


def layer_pattern(text: str, *, flag: str = "--moe-layer-freq") -> list[int]:
    """The list a Megatron layer-pattern expression stands for.

    Grammar: ``expr := term ('+' term)*``, ``term := atom ('*' n)*``,
    ``atom := '[' n (',' n)* ']' | '(' expr ')'``.

    Raises:
        ValueError: one line naming ``flag`` and where the text stops making sense.
    """
    reader = _Reader(text, flag)
    values = _expr(reader)
    if reader.peek():
        raise reader.fail("unexpected text")
    return values


def _expr(reader: _Reader) -> list[int]:
    values = _term(reader)
    while reader.take("+"):
        values = values + _term(reader)
    return values


def _term(reader: _Reader) -> list[int]:
    values = _atom(reader)
    while reader.take("*"):
        values = values * reader.number()
    return values


def _atom(reader: _Reader) -> list[int]:
    if reader.take("("):
        values = _expr(reader)
        if not reader.take(")"):
            raise reader.fail("expected ')'")
        return values
    if reader.take("["):
        values = [reader.number()]
        while reader.take(","):
            values.append(reader.number())
        if not reader.take("]"):
            raise reader.fail("expected ']'")
        return values
    raise reader.fail("expected '[' or '('")


def moe_layout(value: int | str | list[int], num_layers: int, *,
               flag: str = "--moe-layer-freq") -> tuple[int, int]:
    """(leading dense layers, MoE layer frequency) of a ``--moe-layer-freq`` value.

    An integer N means layers 0, N, 2N, ... are MoE (Megatron-Core
    ``TransformerConfig.moe_layer_freq``); a pattern must be some dense layers followed
    by one MoE layer every N layers, the only layouts a ModelSpec expresses.

    Raises:
        ValueError: a pattern of the wrong length or of another shape (one line).
    """
    if isinstance(value, str) and "[" not in value:
        value = int(value) if value.strip().isdigit() else value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{flag}: {value} is not valid; give a whole number >= 1 or a "
                             "layer pattern")
        return 0, value
    pattern = layer_pattern(value, flag=flag) if isinstance(value, str) else list(value)
    if len(pattern) != num_layers or set(pattern) - {0, 1} or 1 not in pattern:
        raise ValueError(f"{flag}: {value!r} is not valid; give {num_layers} entries of 0 "
                         "(dense) and 1 (MoE), at least one 1")
    first = pattern.index(1)
    later = [i - first for i, moe in enumerate(pattern) if moe and i >= first]
    step = later[1] if len(later) > 1 else num_layers - first
    if any(pattern[i] != ((i - first) % step == 0) for i in range(first, num_layers)):
        raise ValueError(f"{flag}: {value!r} is refused: a model here is some leading dense "
                         "layers then one MoE layer every N layers, and this pattern is not")
    return first, step


def pipeline_layout(text: str, *, flag: str = "--pipeline-model-parallel-layout"
                    ) -> tuple[int, ...]:
    """Transformer layers of each pipeline stage of a Megatron layout string.

    The first stage must hold the embedding (``E``) and the last the loss (``L``), as
    trainsim places them; ``m`` (multi-token prediction) is refused.

    Raises:
        ValueError: one line naming ``flag``.
    """
    reader = _Reader(text.replace(",", ""), flag)
    flat = _layout_seq(reader)
    if reader.peek():
        raise reader.fail("unexpected text")
    stages = flat.split("|")
    if "m" in flat:
        raise ValueError(f"{flag}: {text!r} is refused: multi-token-prediction layers (m) "
                         "are not modelled")
    if flat.count("E") != 1 or not stages[0].startswith("E") or flat.count("L") != 1 \
            or not stages[-1].endswith("L"):
        raise ValueError(f"{flag}: {text!r} is refused: trainsim holds the embedding (E) on "
                         "the first stage and the loss (L) on the last, each once")
    return tuple(stage.count("t") for stage in stages)


def _layout_seq(reader: _Reader) -> str:
    out = []
    while reader.peek() and reader.peek() != ")":
        if reader.take("("):
            inner = _layout_seq(reader)
            if not reader.take(")"):
                raise reader.fail("expected ')'")
            piece = inner
        elif reader.peek() in "EtmL|":
            piece = reader.peek()
            reader.at += 1
        else:
            raise reader.fail("expected E, t, m, L, |, or a group in parentheses")
        if reader.take("*"):
            piece *= reader.number()
        out.append(piece)
    return "".join(out)
