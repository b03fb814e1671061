"""``python -m fastload bench``: its arguments, their checks, and its exit codes."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from .report import measure_and_report
from .synthetic_folder import default_cache_dir

__all__ = ["add_arguments", "add_cache_arguments", "run"]


def _parse_size(text: str) -> tuple[int, int]:
    import argparse

    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size must look like 500x375 (width x height), got {text!r}")
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"--size must be positive, got {text!r}")
    return width, height


def _parse_worker_list(text: str) -> list[int]:
    import argparse

    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--plot-workers must be comma-separated ints, got {text!r}")
    if not counts or counts[0] < 0:
        raise argparse.ArgumentTypeError(f"--plot-workers must be non-negative ints, got {text!r}")
    return counts


def add_arguments(parser: Any) -> None:
    """The options of ``python -m fastload bench``."""
    cores = os.cpu_count() or 1
    parser.add_argument("root", nargs="?", metavar="ROOT",
                        help="an ImageFolder directory (ROOT/<class>/<image>); default: a cached "
                             "synthetic one, see --images/--size/--classes")
    synthetic = parser.add_argument_group("synthetic dataset (when ROOT is not given)")
    synthetic.add_argument("--images", type=int, default=2000, help="number of images (default 2000)")
    synthetic.add_argument("--size", type=_parse_size, default=(500, 375), metavar="WxH",
                           help="image size (default 500x375; e.g. 4000x3000 for camera photos)")
    synthetic.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    synthetic.add_argument("--cache-dir", default=None,
                           help=f"where synthetic folders are kept (default {default_cache_dir()})")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--workers", type=int, default=cores,
                        help=f"num_workers (default: all cores, {cores})")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per measurement (default 1)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating rounds with --compare (default 3; 1 without)")
    parser.add_argument("--max-images", type=int, default=None,
                        help="use a fixed random subset of this many images (for huge folders)")
    parser.add_argument("--compare", choices=["torch"], default=None,
                        help="also run torch.utils.data.DataLoader on the same files and pipeline")
    parser.add_argument("--plot", metavar="FILE.png", default=None,
                        help="draw images/s against worker count (see --plot-workers)")
    parser.add_argument("--plot-workers", type=_parse_worker_list, default=None, metavar="0,1,2",
                        help="worker counts for --plot (default 0 .. cores)")
    parser.add_argument("--decode", choices=["auto", "full", "both-reduced"], default="auto",
                        help="auto (default): fastload decodes a JPEG at 1/2 to 1/8 of its size when "
                             "the crop is at least twice the output each way; full: fastload decodes "
                             "every image in full, as torch's side always does (like for like); "
                             "both-reduced: fastload as auto, and torch's loader asks Pillow for "
                             "draft('RGB', (224, 224)), the reduced-size decode a torchvision user "
                             "has (chosen without knowing the crop)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle and augmentation seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_cache_arguments(parser)


def add_cache_arguments(parser: Any) -> None:
    """``--cache DIR``: measure ``ImageFolder(cache=DIR)``, epoch 1 and later epochs apart."""
    parser.add_argument("--cache", metavar="DIR", default=None,
                        help="use a decoded-image cache in DIR (ImageFolder(cache=DIR)) and report "
                             "epoch 1 (filling it) and later epochs (reading it) separately; "
                             "--epochs counts both (at least 2)")
    parser.add_argument("--cache-format", choices=["raw", "jpeg"], default="raw",
                        help="how --cache stores images (default raw pixels)")
    parser.add_argument("--cache-max-side", type=int, default=512, metavar="PIXELS",
                        help="longest side of a cached image (default 512)")


def _check_options(options: Any) -> None:
    for name in ("images", "classes", "batch_size", "epochs"):
        if getattr(options, name) < 1:
            raise SystemExit(f"fastload bench: --{name.replace('_', '-')} must be at least 1, "
                             f"got {getattr(options, name)}")
    if options.workers < 0:
        raise SystemExit(f"fastload bench: --workers must be >= 0, got {options.workers}")
    if options.rounds is not None and options.rounds < 1:
        raise SystemExit(f"fastload bench: --rounds must be at least 1, got {options.rounds}")
    if options.max_images is not None and options.max_images < 1:
        raise SystemExit(f"fastload bench: --max-images must be at least 1, got {options.max_images}")
    if options.root is not None and not os.path.isdir(options.root):
        raise SystemExit(f"fastload bench: ROOT {options.root!r} is not a directory")
    if getattr(options, "cache", None) is not None and options.cache_max_side < 1:
        raise SystemExit(f"fastload bench: --cache-max-side must be at least 1, got "
                         f"{options.cache_max_side}")
    if options.root is None and options.images < options.classes:
        raise SystemExit(f"fastload bench: --images ({options.images}) must be at least --classes "
                         f"({options.classes}): the synthetic folder needs an image in every class")
    # What would fail after minutes of measuring fails now instead.
    if options.compare and importlib.util.find_spec(options.compare) is None:
        raise SystemExit(f"fastload bench: --compare {options.compare} needs {options.compare}, "
                         f"which is not installed: pip install 'fastload[bench]'")
    if options.plot is not None:
        if importlib.util.find_spec("matplotlib") is None:
            raise SystemExit("fastload bench: --plot needs matplotlib, which is not installed: "
                             "pip install 'fastload[bench]'")
        directory = os.path.dirname(os.path.abspath(options.plot))
        if not os.path.isdir(directory):
            raise SystemExit(f"fastload bench: --plot {options.plot!r}: directory {directory!r} "
                             f"does not exist")
        if not os.access(directory, os.W_OK):
            raise SystemExit(f"fastload bench: --plot {options.plot!r}: directory {directory!r} "
                             f"is not writable")
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        extension = os.path.splitext(options.plot)[1][1:].lower()
        if extension and extension not in formats:  # none: matplotlib's default, PNG
            raise SystemExit(f"fastload bench: --plot {options.plot!r}: matplotlib cannot write "
                             f"'.{extension}' files; use one of "
                             f"{', '.join('.' + name for name in sorted(formats))}")


def run(options: Any) -> int:
    """Run the benchmark described by parsed ``options``; prints a report, returns an exit code.

    Problems with the folder or its files (none found, unreadable, not an
    image) end the command with their message, which names the path, and exit
    code 1; Ctrl-C ends it with code 130.  A traceback through the benchmark's
    own code would only bury the message.  Other errors keep their traceback:
    they are bugs to report.
    """
    _check_options(options)
    try:
        return measure_and_report(options)
    except KeyboardInterrupt:
        print("\nfastload bench: interrupted", file=sys.stderr)
        return 130
    except OSError as error:
        print(f"fastload bench: {error}", file=sys.stderr)
        return 1
