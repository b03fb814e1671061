"""What ``python -m fastload bench`` prints: the setup, each side's rate and their ratio."""

from __future__ import annotations

import os
import statistics
from typing import Any

from ..vision import turbo_decode
from .fidelity import decode_psnr
from .measure import compare_rounds, measure_fastload_cached, measure_pipeline_limit, measure_torch
from .pipelines import CROP_SIZE, image_folder, reduced_decode_shares
from .plot import plot_scaling
from .synthetic_folder import synthetic_image_folder

__all__ = ["measure_and_report"]


def _line(label: str, result: dict, limit: float | None = None) -> str:
    text = (f"{label:<28}{result['images_per_s']:>9.1f} images/s  "
            f"{result['input_mb_per_s']:>7.1f} MB/s read  {result['output_mb_per_s']:>7.1f} MB/s out")
    if result.get("first_batch_s") is not None:
        text += f"  first batch {result['first_batch_s']:.2f} s"
    if limit:
        text += f"  {100 * result['images_per_s'] / limit:.0f}% of limit"
    return text


def _decode_line(root: str, options: Any) -> str:
    """Which JPEG decode each side uses, so a ratio is never read as like for like when not."""
    if options.decode == "full":
        return "  decode: full on both sides (--decode full)"
    shares = reduced_decode_shares(root, max_images=options.max_images, seed=options.seed)
    if not any(shares.values()):
        return "  decode: unknown (none of the probed files could be opened)"
    torch = ("torch's loader Pillow draft to 224x224 (--decode both-reduced)"
             if options.decode == "both-reduced" else
             "torch full; --decode full or both-reduced compares like for like")
    if shares[1] == 1.0:
        if options.decode == "auto":
            return ("  decode: full on both sides (no crop is large enough for a reduced-size "
                    "JPEG decode)")
        return f"  decode: fastload full (no crop is large enough for a reduced-size one); {torch}"
    reduced = ", ".join(f"1/{r}: {100 * share:.0f}%" for r, share in shares.items()
                        if r > 1 and share > 0)
    rest = ", full for the rest" if shares[1] > 0 else ""
    return (f"  decode: fastload reduced-size JPEG decode for {100 * (1 - shares[1]):.0f}% of "
            f"images ({reduced}){rest}; {torch}")


def _decoder_line() -> str:
    """Which library decodes fastload's JPEGs (torch's side: Pillow, always)."""
    if turbo_decode.available():
        return ("  decoder: fastload simplejpeg's libjpeg-turbo (Pillow's pixels, bit for bit; "
                "Pillow for other files), torch Pillow")
    return "  decoder: Pillow on both sides (pip install simplejpeg for fastload's faster path)"


def _fidelity_line(root: str, options: Any) -> str | None:
    """The default decode's PSNR against torchvision's decode-crop-resize on the same
    crops; None under ``--decode full`` (bit-identical by construction)."""
    if options.decode == "full":
        return None
    found = decode_psnr(root, max_images=options.max_images, seed=options.seed)
    if found.probed == 0:
        return None
    if found.mean_psnr_db is None:
        return (f"  fidelity: fastload's pixels equal torchvision's decode-crop-resize on all "
                f"{found.probed} probed crops")
    return (f"  fidelity: fastload's default decode vs torchvision's decode-crop-resize, same "
            f"crops: mean PSNR {found.mean_psnr_db:.1f} dB (lowest {found.min_psnr_db:.1f}) over "
            f"the {found.differing} of {found.probed} probed crops that differ")


def _where_the_time_went(report: Any, rounds: int) -> str:
    """fastload's ``loader.report()`` of the measured run, indented under its line."""
    which = "the median round's" if rounds > 1 else "the run's"
    text = "\n".join("    " + line for line in str(report).splitlines())
    return f"  where the time went ({which} loader.report()):\n{text}"


def measure_and_report(options: Any) -> int:
    """Measure what parsed ``options`` ask for, printing each line as its figure lands."""
    progress = not options.no_progress
    if options.root is None:
        root = synthetic_image_folder(options.images, options.size, options.classes,
                                      cache_dir=options.cache_dir, progress=progress)
        origin = f"synthetic, {options.size[0]}x{options.size[1]} JPEGs"
    else:
        root = options.root
        origin = "given folder"
    try:
        folder = image_folder(root)
    except FileNotFoundError as error:
        # torchvision's messages: "no valid file" names only the classes.
        if str(root) not in str(error):
            raise FileNotFoundError(f"{root}: {error}") from error
        raise
    count = len(folder) if options.max_images is None else min(options.max_images, len(folder))
    rounds = options.rounds or (3 if options.compare else 1)
    print(f"fastload bench: {root}\n  {origin}; {count} of {len(folder)} images in "
          f"{len(folder.classes)} classes; pipeline RandomResizedCrop({CROP_SIZE}), "
          f"RandomHorizontalFlip, to uint8 CHW; batch {options.batch_size}, "
          f"{options.workers} workers, {options.epochs} epoch(s) x {rounds} round(s); "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)

    common = dict(max_images=options.max_images, seed=options.seed, decode=options.decode)
    if getattr(options, "cache", None) is not None:
        print("  decode: fastload fills the cache from the smallest JPEG scale that still "
              "covers --cache-max-side in epoch 1, then reads cached pixels; torch full",
              flush=True)
        return _report_cached(options, root, rounds, progress, common)
    print(_decode_line(root, options), flush=True)
    print(_decoder_line(), flush=True)
    fidelity = _fidelity_line(root, options)
    if fidelity is not None:
        print(fidelity, flush=True)
    pipeline = measure_pipeline_limit(root, options.workers, progress=progress, **common)
    limit = pipeline["limit_images_per_s"]
    print(_line("pipeline, no loader, 1 proc", pipeline))
    processes = f"{options.workers} workers" if options.workers else "1 process"
    print(f"{'limit (x ' + processes + ')':<28}{limit:>9.1f} images/s")

    frameworks = ["fastload"] + ([options.compare] if options.compare else [])
    summary = compare_rounds(root, options.workers, options.batch_size, rounds=rounds,
                             epochs=options.epochs, frameworks=frameworks, progress=progress, **common)
    for name in frameworks:
        result = summary[name]
        print(_line(f"{name} ({options.workers} workers)", result, limit))
        if rounds > 1:
            print(f"{'':<28}rounds: " + ", ".join(f"{r:.1f}" for r in result["round_images_per_s"]))
    print(_where_the_time_went(summary["fastload"]["report"], rounds))
    if options.compare:
        ratio = summary["fastload"]["images_per_s"] / summary[options.compare]["images_per_s"]
        print(f"{'fastload / ' + options.compare:<28}{ratio:>9.2f}x")

    if options.plot:
        cores = os.cpu_count() or 1
        counts = options.plot_workers or list(range(0, cores + 1))
        points: dict[str, dict[int, float]] = {name: {} for name in frameworks}
        for workers in counts:
            result = compare_rounds(root, workers, options.batch_size, rounds=rounds,
                                    epochs=options.epochs, frameworks=frameworks, progress=progress,
                                    **common)
            for name in frameworks:
                points[name][workers] = result[name]["images_per_s"]
                print(f"  plot point: {name:<9} {workers} workers "
                      f"{points[name][workers]:>9.1f} images/s")
        title = f"{os.path.basename(root.rstrip(os.sep))}: batch {options.batch_size}, {cores} cores"
        plot_scaling(points, pipeline["images_per_s"], options.plot, title)
        print(f"plot written to {options.plot}")
    return 0


def _report_cached(options: Any, root: str, rounds: int, progress: bool, common: dict) -> int:
    """``--cache DIR``: epoch 1 and epochs 2.. of the cached loader, apart; torch with --compare."""
    epochs = max(options.epochs, 2)
    per_round: list[list[dict]] = []
    torch_rates: list[float] = []
    for round_no in range(rounds):
        seeded = dict(common, seed=options.seed + round_no)
        per_round.append(measure_fastload_cached(root, options.workers, options.cache,
                                                 options.batch_size, epochs=epochs,
                                                 cache_format=options.cache_format,
                                                 cache_max_side=options.cache_max_side,
                                                 progress=progress, **seeded))
        if options.compare:
            torch_rates.append(measure_torch(root, options.workers, options.batch_size,
                                             progress=progress, **seeded)["images_per_s"])
    median = statistics.median
    first = [results[0] for results in per_round]
    print(_line(f"cache, epoch 1 ({options.workers} w)", sorted(
        first, key=lambda r: r["images_per_s"])[len(first) // 2]))
    print(f"{'':<28}rounds: " + ", ".join(f"{r['images_per_s']:.1f}" for r in first)
          + f"; store then held {first[0]['cache_entries']} images ({options.cache})")
    later = [median(r["images_per_s"] for r in results[1:]) for results in per_round]
    print(f"{'cache, epochs 2-' + str(epochs):<28}{median(later):>9.1f} images/s  rounds: "
          + ", ".join(f"{rate:.1f}" for rate in later))
    if torch_rates:
        print(f"{'torch (' + str(options.workers) + ' workers)':<28}{median(torch_rates):>9.1f} "
              f"images/s")
        print(f"{'cache epochs 2+ / torch':<28}{median(later) / median(torch_rates):>9.2f}x")
    return 0
