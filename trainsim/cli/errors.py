"""How the commands fail: one line on stderr, an exit code, never a traceback.

* ``2`` (:data:`EXIT_USAGE`): bad input, ``error: <field>: <value> ...; valid: ...``;
* ``3`` (:data:`EXIT_OOM`): the plan does not fit in GPU memory;
* ``1``: ``validate compare`` past its tolerance (trainsim.cli.validate).

Output paths are checked before a simulation starts (:func:`check_output_path`), so a
result is never lost to a missing directory after minutes of work.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Sequence

EXIT_USAGE = 2
EXIT_OOM = 3


class UserError(ValueError):
    """A mistake in the user's input, reported as one line."""


def check_choice(field: str, value: str, valid: Sequence[str]) -> str:
    """``value`` if it is one of ``valid``.

    Raises:
        UserError: ``"field: 'value' is not valid; valid: a, b"``.
    """
    if value not in valid:
        raise UserError(f"{field}: {value!r} is not valid; valid: {', '.join(valid)}")
    return value


def check_output_path(field: str, path: str | None) -> Path | None:
    """A file the command will write: its directory is created if missing; it must not
    be a directory, and the directory must be writable. Checked before any work.

    Raises:
        UserError: one line naming the option, the path and what is wrong.
    """
    if path is None:
        return None
    target = Path(path).expanduser()
    if target.is_dir():
        raise UserError(f"{field}: {path!r} is a directory; give a file path")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as problem:
        raise UserError(f"{field}: cannot create the directory {str(parent)!r} "
                        f"({problem.strerror}); give a path in a writable directory") from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"{field}: the directory {str(parent)!r} is not writable; give a path "
                        "in a writable directory")
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
