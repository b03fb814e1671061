"""How often a Ctrl-C is lost: interrupt a loop of epochs at random instants.

Each trial starts a process that iterates a DataLoader (2 workers, short
epochs of 125 batches of dict samples) forever, waits a random 0.05-0.4 s,
then sends SIGINT to its whole process group, as a terminal's Ctrl-C does.
The trial counts as *lost* when the process has not ended with
KeyboardInterrupt 3 s (torch: 8 s) later: CPython dropped the exception
inside a ``__del__``, a weakref callback or an at-fork hook (see NOTE [
Ctrl-C held over fork and teardown ] in fastload/_lifetime/interrupts.py).  Trials whose
stderr shows such a dropped KeyboardInterrupt in any process (a worker's
too) are counted as *noisy*.

    python bench/ctrl_c_trials.py --library fastload --trials 300
    python bench/ctrl_c_trials.py --library torch --trials 80
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import time

_CHILD = """
import sys
import numpy as np
if sys.argv[1] == "torch":
    from torch.utils.data import DataLoader
else:
    from fastload import DataLoader
samples = [{"x": np.ones(64, np.float32), "y": i} for i in range(2000)]
loader = DataLoader(samples, batch_size=16, num_workers=2, persistent_workers=sys.argv[2] == "1")
print("READY", flush=True)
try:
    while True:
        for batch in loader:
            pass
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
"""


def trial(library: str, persistent: bool, rng: random.Random) -> tuple[str, str]:
    """('interrupted' | 'lost', stderr) of one interrupted run."""
    process = subprocess.Popen([sys.executable, "-c", _CHILD, library, str(int(persistent))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        process.stdout.readline()  # READY
        time.sleep(rng.uniform(0.05, 0.4))
        os.killpg(process.pid, signal.SIGINT)
        try:
            out, err = process.communicate(timeout=8 if library == "torch" else 3)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            return "lost", err
        return ("interrupted" if "INTERRUPTED" in out else "other"), err
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", choices=["fastload", "torch"], default="fastload")
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    rng = random.Random(options.seed)
    counts: collections.Counter = collections.Counter()
    where: collections.Counter = collections.Counter()
    for _ in range(options.trials):
        outcome, err = trial(options.library, options.persistent, rng)
        counts[outcome] += 1
        if "KeyboardInterrupt" in err and "Exception ignored in" in err:
            counts["noisy"] += 1
            for line in err.splitlines():
                if line.startswith("Exception ignored in"):
                    where[line.split(" at 0x")[0]] += 1
    print(f"{options.library}, {'persistent' if options.persistent else 'new'} workers, "
          f"{options.trials} trials: {dict(counts)}")
    for place, count in where.most_common():
        print(f"  {count} x {place}")


if __name__ == "__main__":
    main()
