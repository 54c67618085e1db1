"""The edge where user files and numbers enter trainsim, checked once for every format.

Every loader of a user file (preset, model, scenario, sweep spec, calibration, failure
profile, Program JSON, measurement records, nccl-tests logs, Megatron-LM argument files,
NeMo/Megatron-Bridge YAML) reads it with :func:`read_input_text` (TOML, JSON and YAML
ones with :func:`load_input`, which also parses)
and checks what it parsed with :func:`check_nesting`. So:

* only regular files are read: a FIFO would block for ever, ``/dev/zero`` never ends and
  a directory is not a file; each is refused in one line, before anything is read;
* a file is at most :data:`MAX_INPUT_BYTES` (no input of trainsim is near that); a
  hand-written file parsed in pure Python (TOML, YAML, a file of command-line arguments)
  at most :data:`MAX_TEXT_BYTES`, so parsing it takes seconds, not minutes;
* parsed data is at most :data:`MAX_NESTING` levels deep and expands to at most
  :data:`MAX_NODES` values (a YAML alias "billion laughs" is a few hundred bytes that
  expand to billions of values);
* numbers are finite and inside a stated range.

Errors are :class:`ValueError` with one line naming the file or field, the value and
what is valid. This module imports nothing of trainsim: the lowest layer uses it too.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

#: Largest input file read, bytes (64 MiB; the largest shipped input is ~1 MiB).
MAX_INPUT_BYTES = 64 * 2**20
#: Largest hand-written input parsed in pure Python (TOML, YAML, argument files), bytes
#: (256 KiB; the largest shipped one is ~8 KB, and PyYAML needs ~15 s for 256 KiB of
#: ``[1,1,...]`` on a busy core).
MAX_TEXT_BYTES = 256 * 2**10
#: Deepest nesting of lists/tables accepted in parsed input.
MAX_NESTING = 32
#: Most values (scalars, lists, tables) parsed input may expand to, aliases followed.
MAX_NODES = 2_000_000


def read_input_bytes(path: str | os.PathLike[str], *, what: str, hint: str,
                     max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file.

    Args:
        path: the file.
        what: the field or option naming the file in errors (``"calibration"``).
        hint: what would be valid, ending the error line (``"give a calibration file"``).
        max_bytes: refuse larger files.

    Raises:
        ValueError: ``"<what>: '<path>' <problem>; <hint>"`` when the file is missing,
            unreadable, a directory, a FIFO/device/socket, larger than ``max_bytes``, or
            (for :func:`read_input_text`) not UTF-8 text.
    """
    shown = repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else repr(path)

    def bad(problem: str) -> ValueError:
        return ValueError(f"{what}: {shown} {problem}; {hint}")

    try:
        # O_NONBLOCK: opening a FIFO without a writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise bad("not found") from None
    except OSError as problem:
        raise bad(f"cannot be read ({problem.strerror})") from None
    except (ValueError, TypeError):  # a NUL byte in the path, or not a path at all
        raise bad("is not a valid path") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise bad("is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise bad("is not a regular file (a FIFO, device or socket)")
        if info.st_size > max_bytes:
            raise bad(f"is {info.st_size:,} bytes, more than the {max_bytes:,} an input "
                      "may have")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            data = handle.read(max_bytes + 1)
    except OSError as problem:
        raise bad(f"cannot be read ({problem.strerror})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise bad(f"is more than the {max_bytes:,} bytes an input may have")
    return data


def read_input_text(path: str | os.PathLike[str], *, what: str, hint: str,
                    max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular file (:func:`read_input_bytes`, decoded).

    Raises:
        ValueError: as :func:`read_input_bytes`, or the file is not UTF-8 text.
    """
    data = read_input_bytes(path, what=what, hint=hint, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as problem:
        shown = repr(os.fspath(path))
        raise ValueError(f"{what}: {shown} is not UTF-8 text (byte {problem.start}); "
                         f"{hint}") from None


def load_input(path: str | os.PathLike[str], *, what: str, hint: str, syntax: str,
               max_bytes: int | None = None) -> tuple[Any, str]:
    """Read a TOML, JSON or YAML input file (:func:`read_input_text`), parse it and check
    its nesting (:func:`check_nesting`); returns ``(data, text)``.

    Args:
        syntax: ``"toml"``, ``"json"`` or ``"yaml"`` (YAML: safe loading only).
        max_bytes: refuse larger files (default: :data:`MAX_INPUT_BYTES` for JSON, which
            machines write and a C parser reads; :data:`MAX_TEXT_BYTES` for TOML and YAML).

    Raises:
        ValueError: one line naming ``what``, the file and the problem: unreadable, not a
            regular file, too large, not UTF-8, a syntax error (with its position), or
            nested too deeply (the parser's own recursion, or :data:`MAX_NESTING`).
    """
    if max_bytes is None:
        max_bytes = MAX_INPUT_BYTES if syntax == "json" else MAX_TEXT_BYTES
    text = read_input_text(path, what=what, hint=hint, max_bytes=max_bytes)
    shown = repr(os.fspath(path))
    try:
        data = _parse(text, syntax)
    except _SyntaxProblem as problem:
        first = " ".join(str(problem).split())
        raise ValueError(f"{what}: {shown} is not valid {syntax.upper()} ({first}); "
                         f"{hint}") from None
    except RecursionError:
        raise ValueError(f"{what}: {shown} nests too deeply; {hint}") from None
    return check_nesting(data, what=f"{what}: {shown}"), text


class _SyntaxProblem(Exception):
    """A parser's syntax error, whatever the parser."""


def _parse(text: str, syntax: str) -> Any:
    """``text`` parsed as ``syntax``; a syntax error is :class:`_SyntaxProblem`."""
    if syntax == "yaml":
        import yaml

        try:
            # The pure-Python loader: its recursion ends in RecursionError, where the C
            # loader's could overflow the C stack on deeply nested input.
            return yaml.safe_load(text)
        except yaml.YAMLError as problem:
            raise _SyntaxProblem(str(problem)) from None
    try:
        return tomllib.loads(text) if syntax == "toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as problem:
        raise _SyntaxProblem(str(problem)) from None


def check_nesting(data: Any, *, what: str, max_depth: int = MAX_NESTING,
                  max_nodes: int = MAX_NODES) -> Any:
    """``data`` (parsed JSON/TOML/YAML) if it nests at most ``max_depth`` levels and
    expands to at most ``max_nodes`` values.

    Shared sub-objects (YAML aliases) are counted once per reference, as a consumer
    walking the data would see them, but each is visited once, so the check is linear
    in the size of the parsed graph, not of its expansion.

    Raises:
        ValueError: one line naming ``what`` and the limit.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id -> (expanded values, depth)
    # Iterative post-order walk: deep data must not exhaust Python's stack here.
    stack: list[tuple[Any, int, bool]] = [(data, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if not isinstance(node, (dict, list, tuple)):
            continue
        if depth > max_depth:
            raise ValueError(f"{what}: nests deeper than {max_depth} levels; valid: at most "
                             f"{max_depth} levels of lists and tables")
        children = list(node.values()) if isinstance(node, dict) else list(node)
        if done:
            total, deepest = 1, 1
            for child in children:
                count, child_depth = sizes.get(id(child), (1, 0))
                total += count
                deepest = max(deepest, 1 + child_depth)
            if total > max_nodes:
                raise ValueError(f"{what}: expands to more than {max_nodes:,} values "
                                 "(YAML aliases are expanded); valid: a smaller input")
            sizes[id(node)] = (total, deepest)
            continue
        if id(node) in sizes:
            continue
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children
                     if isinstance(child, (dict, list, tuple)) and id(child) not in sizes)
    return data


def check_number(where: str, value: Any, *, minimum: float | None = None,
                 maximum: float | None = None, above: bool = False,
                 integer: bool = False) -> int | float:
    """``value`` if it is a finite number (an integer when ``integer``) in range.

    Args:
        where: the field, named in the error (``"nic.gbit_per_s"``).
        minimum, maximum: inclusive bounds (None: unbounded on that side).
        above: the minimum itself is excluded (``> minimum``).
        integer: only whole numbers (a float like ``8.0`` is returned as ``8``).

    Raises:
        ValueError: ``"<where>: <value> is not valid; give a finite number in [a, b]"``.
    """
    low = "" if minimum is None else f"{'>' if above else '>='} {minimum:g}"
    high = "" if maximum is None else f"<= {maximum:g}"
    kind = "a whole number" if integer else "a finite number"
    wanted = f"give {kind}" + (f" {low}" if low else "") + (" and" if low and high else "") \
        + (f" {high}" if high else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {value!r} is not a number; {wanted}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not finite; {wanted}")
        if integer:
            if not value.is_integer():
                raise ValueError(f"{where}: {value!r} is not whole; {wanted}")
            value = int(value)
    if minimum is not None and (value < minimum or (above and value == minimum)):
        raise ValueError(f"{where}: {value!r} is out of range; {wanted}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{where}: {value!r} is out of range; {wanted}")
    return value
