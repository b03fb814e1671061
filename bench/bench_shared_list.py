"""Copy-on-read: what forked workers cost over a list of annotation records.

A detection dataset keeps one COCO-like record per image (a path, sizes, a
list of boxes with labels).  Kept as a Python list, it is copied into every
forked worker page by page as reading touches reference counts (torch issue
13246).  Each case below runs in a fresh process: it builds the records,
starts a loader with ``--workers`` forked, persistent workers, reads one
shuffled epoch (as training does: each worker reads records from all over
the list), and sums the PSS (proportional set size: shared pages split between
the processes sharing them) of the main process and its workers.  Against
the PSS of one process holding the plain list:

* ``fastload + SharedList``: the records in ``fl.SharedList``;
* ``fastload + list`` and ``torch + list``: the plain list.

Then the cost of one access, ``SharedList[i]`` against ``list[i]``.

    python bench/bench_shared_list.py --records 400000 --workers 4
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import psutil  # noqa: E402

MIB = 1 << 20


def annotation_records(n: int) -> list[dict]:
    """COCO-like per-image records: a path, sizes, 1-12 boxes with labels."""
    rng = random.Random(0)
    records = []
    for i in range(n):
        boxes = [{"bbox": [rng.uniform(0, 600), rng.uniform(0, 400), rng.uniform(5, 200),
                           rng.uniform(5, 200)],
                  "category_id": rng.randrange(1, 91), "area": rng.uniform(25, 40000),
                  "iscrowd": 0} for _ in range(rng.randrange(1, 13))]
        records.append({"file_name": f"train2017/{i:012d}.jpg", "image_id": i,
                        "height": 480, "width": 640, "annotations": boxes})
    return records


def pss(pid: int) -> int:
    return psutil.Process(pid).memory_full_info().pss


def run_case(case: str, records: int, workers: int) -> dict:
    """One case, in this process: build, load one epoch, measure."""
    import numpy as np

    data = annotation_records(records)
    gc.collect()
    if case == "single":
        return {"pss": pss(os.getpid())}
    if case == "fastload+SharedList":
        import fastload as fl
        data = fl.SharedList(data)
        gc.collect()

    class Annotations:
        def __init__(self, records):
            self.records = records

        def __len__(self):
            return len(self.records)

        def __getitem__(self, i):
            record = self.records[i]
            return len(record["annotations"]), record["image_id"]

    dataset = Annotations(data)
    if case == "torch+list":
        import torch.utils.data as tud
        loader = tud.DataLoader(dataset, batch_size=256, shuffle=True, num_workers=workers,
                                persistent_workers=True, multiprocessing_context="fork")
    else:
        import fastload as fl
        loader = fl.DataLoader(dataset, batch_size=256, shuffle=True, num_workers=workers,
                               persistent_workers=True, multiprocessing_context="fork")
    start = time.perf_counter()
    iterator = iter(loader)
    seen = sum(int(np.asarray(counts).shape[0]) for counts, _ in iterator)
    seconds = time.perf_counter() - start
    assert seen == records, seen
    pids = [process.pid for process in iterator._workers]
    total = pss(os.getpid()) + sum(pss(pid) for pid in pids)
    return {"pss": total, "main": pss(os.getpid()), "seconds": seconds}


def access_cost(records: int) -> dict:
    """Microseconds per ``SharedList[i]`` and ``list[i]`` (random i), in one process."""
    import fastload as fl

    data = annotation_records(records)
    shared = fl.SharedList(data)
    indices = [random.Random(1).randrange(records) for _ in range(100_000)]

    def read(container):
        for i in indices:
            container[i]

    out = {}
    for name, container in (("list", data), ("SharedList", shared)):
        best = min(timeit.repeat(lambda: read(container), number=1, repeat=3))
        out[name] = best / len(indices) * 1e6
    out["SharedList bytes"] = shared.nbytes
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        result = access_cost(args.records) if args.case == "access" else \
            run_case(args.case, args.records, args.workers)
        print("RESULT", json.dumps(result), flush=True)
        return
    results = {}
    for case in ("single", "fastload+SharedList", "fastload+list", "torch+list", "access"):
        proc = subprocess.run([sys.executable, __file__, "--case", case, "--records",
                               str(args.records), "--workers", str(args.workers)],
                              capture_output=True, text=True, check=True)
        line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
        results[case] = json.loads(line[len("RESULT "):])
    single = results["single"]["pss"]
    print(f"{args.records} COCO-like records, {args.workers} forked workers, one shuffled "
          f"epoch, batch 256")
    print(f"one process holding the list: PSS {single / MIB:.0f} MiB")
    print("| case | total PSS, main + workers | x single process | epoch |")
    print("|---|---:|---:|---:|")
    for case in ("fastload+SharedList", "fastload+list", "torch+list"):
        r = results[case]
        print(f"| {case} | {r['pss'] / MIB:.0f} MiB | {r['pss'] / single:.2f}x | "
              f"{r['seconds']:.1f} s |")
    access = results["access"]
    print(f"one access: list[i] {access['list']:.2f} us, SharedList[i] "
          f"{access['SharedList']:.2f} us; the SharedList holds "
          f"{access['SharedList bytes'] / MIB:.0f} MiB")


if __name__ == "__main__":
    main()
