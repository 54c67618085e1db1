"""``trainsim hardware list|show``: the cluster presets and the source of every number."""

from __future__ import annotations

from typing import List, Optional

import typer

from trainsim.cli import options
from trainsim.cli.errors import check_choice, json_text
from trainsim.cli.output import comment, console, hyphen_wrapped, table

FORMATS = ("table", "csv", "json")
#: Columns of ``hardware list``'s table (the CSV and JSON have them all).
LIST_COLUMNS = {"name": "name", "gpu": "gpu", "gpus_per_node": "GPUs/\nnode",
                "nvlink_domain_gpus": "NVLink\nGPUs", "nvlink_GBps_per_gpu": "NVLink\nGB/s",
                "nvls": "NVLS", "nics_per_node": "NICs/\nnode", "nic_Gbps": "NIC\nGb/s",
                "nic_kind": "NIC", "fabric": "fabric"}
#: Console width that holds ``hardware list`` with whole GPU names and fabrics.
_WIDE_LIST_COLUMNS = 100
#: Shorter headers of a narrower console.
_NARROW_HEADERS = {"nvlink_domain_gpus": "NVL\nGPUs", "nvlink_GBps_per_gpu": "NVL\nGB/s"}


def register(app: typer.Typer) -> None:
    """Add the ``hardware`` sub-app (``list``, ``show``) to ``app``."""
    hardware_app = typer.Typer(help="List and inspect cluster presets.", no_args_is_help=True)
    hardware_app.command("list")(hardware_list)
    hardware_app.command("show")(hardware_show)
    app.add_typer(hardware_app, name="hardware")


def hardware_list(
    output_format: str = options.format_option(FORMATS),
) -> None:
    """List the built-in cluster presets."""
    from trainsim import api

    check_choice("format", output_format, FORMATS)
    df = api.hardware_list()
    if output_format == "json":
        print(json_text(df.to_dict(orient="records"), indent=1))
    elif output_format == "csv":
        print(df.to_csv(index=False), end="")
    else:
        out = console()
        # Below 100 columns GPU names and fabrics break after a hyphen (never mid-word)
        # and the NVLink headers shorten: the table then fits 80.
        narrow = out.width < _WIDE_LIST_COLUMNS
        headers = {**LIST_COLUMNS, **(_NARROW_HEADERS if narrow else {})}
        rows = ([hyphen_wrapped(_cell(row[c]), 10) if narrow and c in ("gpu", "fabric")
                 else _cell(row[c]) for c in headers]
                for row in df.to_dict(orient="records"))
        out.print(table(list(headers.values()), rows,
                        left=("name", "gpu", "NVLS", "NIC", "fabric"), gap=1))


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) else str(value)


def hardware_show(
    preset: str = typer.Argument(..., help="Preset name or preset TOML file."),
    output_format: str = options.format_option(("json", "table"), default="json"),
    set_: Optional[List[str]] = options.set_option(),
) -> None:
    """Show every field of a preset by the name --set takes, with the source of each
    number (JSON: nested as in a preset file, plus "sources")."""
    from trainsim.preset_fields import preset_fields, preset_tree

    check_choice("format", output_format, ("json", "table"))
    fields = preset_fields(preset, options.parse_overrides(set_))
    if output_format == "json":
        print(json_text(preset_tree(fields), indent=1))
        return
    out = console()
    comment(out, f"# {fields[0].value}: every field by the name --set takes, in the unit the "
                 "name says (gb = 1e9 B, gib = 2^30 B, us = 1e-6 s, gbit = 1e9 bit)")
    rows = ((item.key, _shown(item.value), item.source) for item in fields)
    out.print(table(("field (--set KEY=VALUE)", "value", "source"), rows,
                    left=("field (--set KEY=VALUE)", "value", "source"),
                    wrap=("value", "source"), max_widths={"value": 22}))


def _shown(value) -> str:
    """A value as --set takes it back (12 significant digits, TOML booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:.12g}" if isinstance(value, float) else str(value)
