"""The `modsent` command line.

    modsent languages [--paper]           the language registry (code, FLORES-200, NLLB, script, name)
    modsent check-config FILE [FILE ...]  check configs against the schema without running anything
"""

from __future__ import annotations

import argparse
import sys

import yaml

PAPER_LANGUAGES = "am ar az cs de en es fr ha it kk ko ky mr nl pl ru rw te tr ug uz zh".split()


def cmd_languages(args: argparse.Namespace) -> int:
    from modsent import languages as registry

    codes = PAPER_LANGUAGES if args.paper else registry.codes()
    print("code\tflores\tnllb\tscript\tname")
    for code in codes:
        lang = registry.get(code)
        print(f"{lang.code}\t{lang.flores}\t{lang.nllb or '-'}\t{lang.script}\t{lang.name}")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from modsent.config import ConfigError, check_config

    failed = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as handle:
                config = yaml.safe_load(handle) or {}
            check_config(config)
            print(f"{path}: ok")
        except (ConfigError, OSError, yaml.YAMLError) as err:
            print(f"{path}: {err}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modsent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("languages", help="list the language registry")
    p.add_argument("--paper", action="store_true", help="only the paper's 23 languages")
    p.set_defaults(func=cmd_languages)
    p = sub.add_parser("check-config", help="check config files against the schema")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_check_config)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
