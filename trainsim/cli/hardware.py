"""``trainsim hardware list|show``: the cluster presets and the source of every number."""

from __future__ import annotations

from typing import List, Optional

import typer

from trainsim.cli import options
from trainsim.cli.errors import check_choice, json_text
from trainsim.cli.output import console, table

FORMATS = ("table", "csv", "json")
#: Columns of ``hardware list``'s table (the CSV and JSON have them all).
LIST_COLUMNS = {"name": "name", "gpu": "gpu", "gpus_per_node": "GPUs/\nnode",
                "nvlink_domain_gpus": "NVLink\nGPUs", "nvlink_GBps_per_gpu": "NVLink\nGB/s",
                "nvls": "NVLS", "nics_per_node": "NICs/\nnode", "nic_Gbps": "NIC\nGb/s",
                "nic_kind": "NIC", "fabric": "fabric"}


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
        rows = ([_cell(row[c]) for c in LIST_COLUMNS] for row in df.to_dict(orient="records"))
        console().print(table(list(LIST_COLUMNS.values()), rows,
                              left=("name", "gpu", "NVLS", "NIC", "fabric"),
                              wrap=("gpu", "fabric")))


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) else str(value)


def hardware_show(
    preset: str = typer.Argument(..., help="Preset name or preset TOML file."),
    output_format: str = options.format_option(("json", "table"), default="json"),
    set_: Optional[List[str]] = options.set_option(),
) -> None:
    """Show every field of a preset, with the source of each number."""
    from trainsim import api

    check_choice("format", output_format, ("json", "table"))
    data = api.hardware_show(preset, options.parse_overrides(set_))
    if output_format == "json":
        print(json_text(data, indent=1))
        return
    sources = data.get("sources", {})
    rows = ((key, str(value), sources.get(key, "")) for key, value in _flatten(data)
            if not key.startswith("sources."))
    console().print(table(("field", "value", "source"), rows,
                          left=("field", "value", "source"), wrap=("value", "source")))


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, path + ".")
        else:
            yield path, value
