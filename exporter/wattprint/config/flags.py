"""The options on the command line: one --flag per option; argv, env and file to a Config."""

from __future__ import annotations

import argparse
import os

from wattprint.config.options import OPTIONS, Config, build_config, metavar


def exporter_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, sub: bool = False
) -> None:
    # On a subcommand, unset flags must not overwrite the ones given before it.
    default = argparse.SUPPRESS if sub else None
    parser.add_argument(
        "--config.file",
        dest="config_file",
        default=default,
        metavar="PATH",
        help="YAML file of flag names to values; flags and env override it "
        "(env: WATTPRINT_CONFIG_FILE)",
    )
    for option in OPTIONS:
        # An empty default means "off" or "see the help text"; showing '' says nothing.
        shown = f"default {option.default}; " if option.default else ""
        parser.add_argument(
            f"--{option.flag}",
            dest=f"opt:{option.flag}",
            default=default,
            metavar=metavar(option),
            help=f"{option.help} ({shown}env {option.env})",
        )


def load(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Config:
    env = dict(os.environ) if environ is None else environ
    flags = {
        key[4:]: value
        for key, value in vars(args).items()
        if key.startswith("opt:") and value is not None
    }
    config_file = args.config_file or env.get("WATTPRINT_CONFIG_FILE", "")
    return build_config(flags, env, config_file)
