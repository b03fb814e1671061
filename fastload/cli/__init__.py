"""``python -m fastload bench``: the command, its progress bars and the synthetic data it loads.

command (arguments, exit codes) -> report (what it prints) -> measure (timed
epochs and rounds) -> pipelines (fastload's and torch's per-sample work);
synthetic_folder caches the folder synthetic writes; progress draws the bars.
"""

from .command import add_arguments, run
from .measure import (compare_rounds, measure_fastload, measure_fastload_cached,
                      measure_pipeline_limit, measure_torch)
from .pipelines import (CROP_SIZE, TorchvisionStylePipeline, full_decode_loader,
                        reduced_decode_shares, standard_transform)
from .plot import plot_scaling
from .progress import PlainProgress, progress_bar
from .synthetic import synthetic_image, write_image_folder
from .synthetic_folder import default_cache_dir, synthetic_image_folder

__all__ = [
    "add_arguments", "run",
    "compare_rounds", "measure_fastload", "measure_fastload_cached", "measure_pipeline_limit",
    "measure_torch",
    "CROP_SIZE", "TorchvisionStylePipeline", "full_decode_loader", "reduced_decode_shares",
    "standard_transform",
    "plot_scaling",
    "PlainProgress", "progress_bar",
    "synthetic_image", "write_image_folder",
    "default_cache_dir", "synthetic_image_folder",
]
