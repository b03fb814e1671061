"""``python -m fastload <command>``: the command line (the engines live in their modules)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastload",
                                     description="fastload command-line tools")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from . import cli

    bench_parser = commands.add_parser(
        "bench", help="image-folder loading throughput (optionally against torch)",
        description="Load an image folder with the standard training pipeline and print "
                    "images/s and MB/s; --compare torch runs torch.utils.data.DataLoader on the "
                    "same files in the same run.")
    cli.add_arguments(bench_parser)
    bench_parser.set_defaults(run=cli.run)

    options = parser.parse_args(argv)
    return options.run(options)


if __name__ == "__main__":
    sys.exit(main())
