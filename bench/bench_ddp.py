"""DDP training throughput: examples/train_ddp.py fed by fastload against torch's DataLoader.

Each round runs the example under torchrun (CPU, gloo, 127.0.0.1) once with
``--loader fastload`` and once with ``--loader torch`` (the order alternates from
round to round), same image folder, same model, same batch and worker counts, and
reads the summary line rank 0 prints: images/s over the whole run (worker start-up
included), and the median step time and data wait (time blocked on the loader) of
the steps after the first.  Medians over rounds, and fastload's ratio to torch's.
The network is small, so on a CPU box the step is mostly the model: data wait is
where a loader shows.

    python bench/bench_ddp.py                       # 2 ranks x 1 worker, 3 rounds
    python bench/bench_ddp.py --ranks 4 --workers 4 --images 20000 --image-size 375
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")
METRICS = ("images_per_s", "step_ms", "data_wait_ms")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_once(options: argparse.Namespace, loader: str) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(options.ranks), "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), EXAMPLE, "--loader", loader,
               "--images", str(options.images), "--image-size", str(options.image_size),
               "--crop", str(options.crop), "--batch-size", str(options.batch_size),
               "--workers", str(options.workers), "--epochs", str(options.epochs)]
    if options.data:
        command += ["--data", options.data]
    env = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    result = subprocess.run(command, env=env, capture_output=True, text=True,
                            timeout=options.timeout, start_new_session=True)
    if result.returncode != 0:
        raise SystemExit(f"{loader} run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="an image folder; default: the synthetic one")
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--crop", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    options = parser.parse_args()
    results: dict[str, list[dict]] = {"fastload": [], "torch": []}
    run_once(options, "fastload")  # builds the synthetic folder once, outside the rounds
    for round_no in range(options.rounds):
        order = ("fastload", "torch") if round_no % 2 == 0 else ("torch", "fastload")
        for loader in order:
            started = time.perf_counter()
            summary = run_once(options, loader)
            results[loader].append(summary)
            print(f"round {round_no + 1} {loader:8s} " + "  ".join(
                f"{m}={summary[m]}" for m in METRICS)
                + f"  ({time.perf_counter() - started:.0f} s with start-up)", flush=True)
    print(f"\n{options.ranks} ranks x {options.workers} workers, batch {options.batch_size}/rank, "
          f"{options.images} images {options.image_size}px, crop {options.crop}, "
          f"medians of {options.rounds} rounds")
    print(f"{'':10s}" + "".join(f"{m:>16s}" for m in METRICS))
    medians = {loader: {m: statistics.median(r[m] for r in runs) for m in METRICS}
               for loader, runs in results.items()}
    for loader, values in medians.items():
        print(f"{loader:10s}" + "".join(f"{values[m]:16.2f}" for m in METRICS))
    ratio = {m: medians["fastload"][m] / medians["torch"][m] if medians["torch"][m] else
             float("nan") for m in METRICS}
    print(f"{'ratio':10s}" + "".join(f"{ratio[m]:16.2f}" for m in METRICS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
