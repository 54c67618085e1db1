"""Checks of a finished sweep that a reader of its table would want to be told about.

:func:`unchanged_axes`: the inputs a sweep varies whose values left every output the
same. Such an axis usually means the question was asked where it has no effect (a fabric
oversubscription on a job whose traffic never crosses a leaf switch), and the table's
identical rows would otherwise be read as an answer.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

__all__ = ["unchanged_axes"]

#: Columns of the sweep table that are neither inputs nor outputs.
_BOOKKEEPING = {"scenario", "scenario_id", "kind", "status", "error"}


def _key(value: Any) -> str:
    return repr(value)


def unchanged_axes(scenarios: Sequence[Mapping[str, Any]], frame: pd.DataFrame
                   ) -> list[str]:
    """Inputs that take two or more values over ``scenarios`` while every output of the
    table (its successful rows) stays the same whenever only that input changes.

    An axis is reported only when some rows differ in it alone (all other inputs equal),
    so a list of unrelated scenarios reports nothing.
    """
    if frame.empty or "status" not in frame:
        return []
    inputs = sorted({key for s in scenarios for key in s} - {"kind"})
    ok = frame[frame["status"] == "ok"]
    outputs = [c for c in ok.columns if c not in _BOOKKEEPING and c not in inputs]
    if ok.empty or not outputs:
        return []
    rows = [{key: _key(scenarios[i].get(key)) for key in inputs}
            for i in ok["scenario"]]
    keyed = pd.DataFrame(rows, index=ok.index)
    values = ok[outputs].astype(str)  # one comparable text per output (NaN included)
    found = []
    for axis in inputs:
        if keyed[axis].nunique() < 2:
            continue
        others = [key for key in inputs if key != axis]
        compared = False
        same = True
        for _, group in keyed.groupby(others, sort=False) if others else [(None, keyed)]:
            if group[axis].nunique() < 2:
                continue
            compared = True
            if len(values.loc[group.index].drop_duplicates()) > 1:
                same = False
                break
        if compared and same:
            found.append(axis)
    return found
