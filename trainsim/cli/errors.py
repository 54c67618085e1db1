"""How the commands fail: one line on stderr, an exit code, never a traceback.

* ``2`` (:data:`EXIT_USAGE`): bad input, ``error: <field>: <value> ...; valid: ...``;
* ``3`` (:data:`EXIT_OOM`): the plan does not fit in GPU memory;
* ``1`` (:data:`EXIT_FAILED`): ``validate compare`` past its tolerance
  (trainsim.cli.validate), a rank of a measurement that failed, or a fault of trainsim
  itself (``error: internal: ...``, one line too; ``TRAINSIM_TRACEBACK=1`` shows the
  traceback for a bug report).

Output paths are checked before a simulation starts (:func:`check_output_path`,
:func:`check_output_dir`), so a result is never lost to a missing directory after
minutes of work, and JSON output never holds NaN or infinity (:func:`json_text`).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # (the memory model is imported only when a command needs it)
    from strategies.memory import OutOfMemoryError, Remedy

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_OOM = 3


class UserError(ValueError):
    """A mistake in the user's input, reported as one line."""


class InternalError(RuntimeError):
    """trainsim produced something it must not (e.g. a non-finite number in a result)."""


def oom_message(oom: OutOfMemoryError) -> str:
    """The one-line message of an out-of-memory error with its remedies spelled as the
    command line takes them (``--recompute full``, ``--zero 2``, ``--micro-batch 1``)
    rather than as the Python API does (``recompute='full'``)."""
    return oom.message(_remedy_flags)


def remedies_json(oom: OutOfMemoryError) -> list:
    """The error's remedies for JSON output: ``{"field": ..., "value": ...}`` per plan
    change, plain advice as a string."""
    from strategies.memory import Remedy

    return [{"field": s.field, "value": s.value} if isinstance(s, Remedy) else s
            for s in oom.suggestions]


def _remedy_flags(remedy: Remedy) -> str:
    from trainsim.plan_fields import BY_NAME

    flag = BY_NAME[remedy.field].options[0] if remedy.field in BY_NAME else remedy.field
    return f"{flag} {remedy.value}"


def check_choice(field: str, value: str, valid: Sequence[str]) -> str:
    """``value`` if it is one of ``valid``.

    Raises:
        UserError: ``"field: 'value' is not valid; valid: a, b"``.
    """
    if value not in valid:
        raise UserError(f"{field}: {value!r} is not valid; valid: {', '.join(valid)}")
    return value


def _name_max(directory: Path) -> int:
    """Longest file name the directory's file system takes (255 on Linux file systems)."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _checked_target(field: str, path: str, what: str) -> Path:
    """``path`` as a Path whose components fit the file system and whose directory
    chain holds no file (so ``mkdir`` can create the rest)."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise UserError(f"{field}: {path!r} is not a path; give a {what} path")
    target = Path(path).expanduser()
    probe = target.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    limit = _name_max(probe if probe.is_dir() else Path("."))
    for part in target.parts:
        if len(os.fsencode(part)) > limit:
            raise UserError(f"{field}: the name {part[:40]!r}... is {len(os.fsencode(part))} "
                            f"bytes; valid: names of at most {limit} bytes")
    for ancestor in reversed(target.parents):
        if ancestor.exists() and not ancestor.is_dir():
            raise UserError(f"{field}: {str(ancestor)!r} is a file, not a directory; give a "
                            f"{what} path in a directory")
    return target


def _make_directory(field: str, directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as problem:
        raise UserError(f"{field}: cannot create the directory {str(directory)!r} "
                        f"({problem.strerror}); give a path in a writable directory") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UserError(f"{field}: the directory {str(directory)!r} is not writable; give a "
                        "path in a writable directory")


def check_output_path(field: str, path: str | None) -> Path | None:
    """A file the command will write: its directory is created if missing; it must not
    be a directory, its names must fit the file system, and the directory must be
    writable. Checked before any work.

    Raises:
        UserError: one line naming the option, the path and what is wrong.
    """
    if path is None:
        return None
    target = _checked_target(field, path, "file")
    if target.is_dir() or path.endswith(("/", os.sep)):
        raise UserError(f"{field}: {path!r} is a directory; give a file path")
    if target.exists() and not target.is_file():
        raise UserError(f"{field}: {path!r} is not a regular file (a FIFO, device or "
                        "socket); give a file path")
    _make_directory(field, target.parent)
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{field}: {path!r} exists and is not writable; give another path")
    return target


#: ``[<file>: ]<field>: '<value>' is not ...; valid: a, b, c`` (the convention above).
_NOT_VALID = re.compile(r"^(?P<head>.*?'(?P<value>[^']*)' is not [^;]*)"
                        r"(?P<tail>; valid: (?P<valid>.*))$")


def with_suggestion(message: str) -> str:
    """``message`` with ``(did you mean 'x'?)`` before its ``valid:`` list when the value
    given is close to one of the valid names (a misspelled preset, model, schedule,
    profile, collective, ...); otherwise ``message`` unchanged."""
    found = _NOT_VALID.match(message)
    if not found or found["value"] == "":
        return message
    listed = re.sub(r"\([^)]*\)\s*$", "", found["valid"])  # drop "(or a path ...)"
    names = [name.strip() for name in listed.split(",")]
    names = [name for name in names if re.fullmatch(r"[\w.\-]+", name)]
    close = difflib.get_close_matches(found["value"], names, n=1, cutoff=0.7)
    if not close or close[0] == found["value"]:
        return message
    return f"{found['head']} (did you mean {close[0]!r}?){found['tail']}"


def check_output_dir(field: str, path: str | None) -> Path | None:
    """A directory the command will write into: created if missing; it must not be a
    file, and must be writable. Checked before any work.

    Raises:
        UserError: one line naming the option, the path and what is wrong.
    """
    if path is None:
        return None
    target = _checked_target(field, path, "directory")
    if target.exists() and not target.is_dir():
        raise UserError(f"{field}: {path!r} is a file; give a directory")
    _make_directory(field, target)
    return target


def _finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InternalError(f"the result holds {value!r} at {where or 'top level'}; a result "
                            "must be finite")
    if isinstance(value, dict):
        for key, item in value.items():
            _finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _finite(item, f"{where}[{index}]")


def json_text(data: Any, **options: Any) -> str:
    """``json.dumps(data)`` that refuses NaN and infinity (not JSON; a reader of the
    output would fail or, worse, read them as numbers).

    Raises:
        InternalError: naming where the non-finite number sits.
    """
    _finite(data, "")
    return json.dumps(data, allow_nan=False, **options)


def exit_code_for(problem: BaseException) -> tuple[int, str]:
    """The exit code and the one ``error: ...`` line for an exception a command raised.

    Bad input (ValueError, including UserError, and a refused file) exits
    :data:`EXIT_USAGE`, with a "did you mean" for a misspelled name; a file the system refused (OSError) too, naming the file. Anything
    else is a fault of trainsim: ``error: internal: <type>: <message>``, exit
    :data:`EXIT_FAILED` (never a traceback, unless ``TRAINSIM_TRACEBACK=1``).
    """
    if isinstance(problem, ValueError):
        text = str(problem)
        return EXIT_USAGE, with_suggestion(
            " ".join((text.splitlines() or [type(problem).__name__])[0].split()))
    if isinstance(problem, MemoryError):
        return EXIT_FAILED, "out of memory; give a smaller job, grid or seed count"
    if isinstance(problem, OSError) and not isinstance(problem, BrokenPipeError):
        name = f" {problem.filename!r}" if problem.filename else ""
        return EXIT_USAGE, f"file{name}: {problem.strerror or problem}"
    text = " ".join(str(problem).split())[:300]
    return EXIT_FAILED, (f"internal: {type(problem).__name__}: {text} (a fault of trainsim, "
                         "not of the input; TRAINSIM_TRACEBACK=1 shows where)")
