"""What resumable loading costs: fastload against torchdata's StatefulDataLoader.

Two measurements, both on the same data, batches and machine, in alternating
rounds (fastload, torchdata, fastload, ...), medians reported:

* **Keeping state, per batch.**  A map-style dataset of 20,000 samples
  ((64,) float32 and an int label), batch 32, with ``state_dict`` /
  ``load_state_dict`` (a counter, a numpy generator's state and a ballast of
  ``--state-bytes``), against the same dataset without the two methods.
  The cost of keeping state is the difference of their time per batch over an
  epoch: with workers, each snapshot is taken in a worker and travels to the
  main process; ``snapshot_every_n_steps`` (``--every``) sets how often.  Also
  timed: one ``loader.state_dict()`` call mid-epoch.
* **Resuming mid-epoch.**  1,000,000 samples (an int64 column), batch 256,
  shuffled with a seeded generator: a state taken at the epoch's middle is
  loaded into a new loader and timed from ``load_state_dict`` to the first
  batch in hand (fastload re-draws the epoch's order and skips the handed
  batches' indices; torchdata fast-forwards its sampler).

    python bench/bench_resume.py                      # 0 and 2 workers, 3 rounds
    python bench/bench_resume.py --rounds 5 --every 1 64 --write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload as fl  # noqa: E402
from results import write_section  # noqa: E402

SAMPLES, FEATURES, BATCH = 20_000, 64, 32
RESUME_SAMPLES, RESUME_BATCH = 1_000_000, 256


class Table:
    """The samples, without state methods (the baseline)."""

    def __init__(self, state_bytes: int = 0) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
        self.y = rng.integers(0, 10, SAMPLES)
        self.served = 0
        self.rng = np.random.default_rng(1)
        self.ballast = bytes(state_bytes)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple:
        self.served += 1
        return self.x[i], int(self.y[i])


class StatefulTable(Table):
    """The same samples, with a state: what it served, a generator, ballast."""

    def state_dict(self) -> dict:
        return {"served": self.served, "rng": self.rng.bit_generator.state,
                "ballast": self.ballast}

    def load_state_dict(self, state: dict) -> None:
        self.served = state["served"]
        self.rng.bit_generator.state = state["rng"]


def torchdata_loader(**kwargs: Any) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(**kwargs)


def fastload_loader(**kwargs: Any) -> Any:
    return fl.DataLoader(**kwargs)


LIBRARIES: dict[str, Callable[..., Any]] = {"fastload": fastload_loader,
                                           "torchdata": torchdata_loader}


def epoch_per_batch(make: Callable[..., Any], dataset: Any, workers: int, every: int) -> tuple:
    """(seconds per batch over one epoch, seconds of one state_dict() mid-epoch)."""
    loader = make(dataset=dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                  snapshot_every_n_steps=every,
                  persistent_workers=workers > 0, **({"prefetch_factor": 2} if workers else {}))
    iter_first = iter(loader)
    next(iter_first)  # workers started: the epochs timed are steady ones
    for _ in iter_first:
        pass
    start = time.perf_counter()
    count, state_time = 0, 0.0
    for count, _ in enumerate(loader, 1):
        if count == 100:
            taken = time.perf_counter()
            loader.state_dict()
            state_time = time.perf_counter() - taken
    elapsed = time.perf_counter() - start - state_time
    return elapsed / count, state_time


def keeping_state(rounds: int, workers_list: list[int], everies: list[int],
                  state_bytes: int) -> list[dict]:
    rows = []
    for workers in workers_list:
        for every in everies:
            times: dict[tuple, list] = {}
            for _ in range(rounds):
                for library, make in LIBRARIES.items():  # alternating rounds
                    for stateful in (False, True):
                        dataset = (StatefulTable if stateful else Table)(state_bytes)
                        per_batch, state_time = epoch_per_batch(make, dataset, workers, every)
                        times.setdefault((library, stateful), []).append(per_batch)
                        if stateful:
                            times.setdefault((library, "state_dict"), []).append(state_time)
            for library in LIBRARIES:
                plain = statistics.median(times[(library, False)])
                kept = statistics.median(times[(library, True)])
                rows.append({"library": library, "workers": workers, "every": every,
                             "plain_us": plain * 1e6, "stateful_us": kept * 1e6,
                             "cost_us": (kept - plain) * 1e6,
                             "state_dict_us": statistics.median(
                                 times[(library, "state_dict")]) * 1e6})
    return rows


def resume_time(make: Callable[..., Any], workers: int, column: Any, generator: Callable) -> float:
    def build() -> Any:
        return make(dataset=column, batch_size=RESUME_BATCH, shuffle=True, num_workers=workers,
                    generator=generator())

    loader = build()
    iterator = iter(loader)
    for _ in range(len(loader) // 2):
        next(iterator)
    state = loader.state_dict()
    del iterator
    resumed = build()
    start = time.perf_counter()
    resumed.load_state_dict(state)
    next(iter(resumed))
    return time.perf_counter() - start


def resuming(rounds: int, workers_list: list[int]) -> list[dict]:
    import torch

    values = np.arange(RESUME_SAMPLES, dtype=np.int64)
    columns = {"fastload": fl.ArrayDataset(values),
               "torchdata": torch.utils.data.TensorDataset(torch.from_numpy(values))}

    def seeded() -> Any:
        return torch.Generator().manual_seed(7)

    rows = []
    for workers in workers_list:
        times: dict[str, list] = {}
        for _ in range(rounds):
            for library, make in LIBRARIES.items():
                times.setdefault(library, []).append(
                    resume_time(make, workers, columns[library], seeded))
        rows += [{"library": library, "workers": workers,
                  "resume_ms": statistics.median(times[library]) * 1e3} for library in LIBRARIES]
    return rows


def report(state_rows: list[dict], resume_rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"Keeping state ({SAMPLES:,} samples, batch {BATCH}, shuffled, persistent workers; "
             f"state ballast {args.state_bytes:,} bytes; {args.rounds} alternating rounds, "
             f"medians). Time per batch over an epoch, without and with the dataset's "
             f"state methods; the difference is what keeping state costs per batch:", "",
             "| library | workers | snapshot every | plain us/batch | stateful us/batch | "
             "cost us/batch | state_dict() us |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in state_rows:
        lines.append(f"| {row['library']} | {row['workers']} | {row['every']} | "
                     f"{row['plain_us']:.1f} | {row['stateful_us']:.1f} | {row['cost_us']:+.1f} | "
                     f"{row['state_dict_us']:.0f} |")
    lines += ["", f"Resuming at the middle of a {RESUME_SAMPLES:,}-sample epoch (batch "
              f"{RESUME_BATCH}, shuffled, seeded): from load_state_dict to the first batch:", "",
              "| library | workers | ms |", "|---|---:|---:|"]
    lines += [f"| {row['library']} | {row['workers']} | {row['resume_ms']:.1f} |"
              for row in resume_rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--every", type=int, nargs="+", default=[1, 64],
                        help="snapshot_every_n_steps values (workers only; 0 workers reads "
                             "the state when asked)")
    parser.add_argument("--state-bytes", type=int, default=4096)
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md's section")
    args = parser.parse_args()
    state_rows = keeping_state(args.rounds, args.workers, args.every, args.state_bytes)
    resume_rows = resuming(args.rounds, args.workers)
    text = report(state_rows, resume_rows, args)
    print(text)
    if args.write:
        write_section("bench_resume", "## Resuming (bench/bench_resume.py)\n\n" + text)


if __name__ == "__main__":
    main()
