"""``python -m fastload bench`` end to end: its output, exit codes and messages."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fastload.vision import turbo_decode
from paths import REPO_DIR
from PIL import Image


def run_cli(*args: str, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra_env)
    return subprocess.run([sys.executable, "-m", "fastload", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO_DIR)


def rates(output: str, label: str) -> list[float]:
    return [float(m) for m in re.findall(rf"^{re.escape(label)}.*?([\d.]+) images/s", output, re.M)]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_bench_runs_on_a_folder(tiny_folder, workers):
    done = run_cli("bench", tiny_folder, "--epochs", "1", "--workers", workers, "--batch-size", "8",
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "40 of 40 images in 4 classes" in done.stdout
    assert rates(done.stdout, "pipeline, no loader")[0] > 0
    assert rates(done.stdout, f"fastload ({workers} workers)")[0] > 0
    assert "MB/s read" in done.stdout
    # loader.report() of the run, with the folder's decode told from its transforms
    assert "where the time went (the run's loader.report()):" in done.stdout
    assert re.search(r"^    data loading costs \d+ % of step time", done.stdout, re.M)
    assert re.search(r"fetch \d+ % \(of which decode \d+ %, transform \d+ %\)", done.stdout)
    maker = "main" if workers == "0" else "worker 1"
    assert re.search(rf"^    {maker}\s+\d+\s", done.stdout, re.M)


def test_bench_without_root_generates_and_caches_a_synthetic_folder(tmp_path):
    args = ("bench", "--images", "12", "--size", "48x32", "--classes", "3", "--workers", "0",
            "--batch-size", "4", "--no-progress")
    first = run_cli(*args, FASTLOAD_CACHE=str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert "synthetic, 48x32 JPEGs; 12 of 12 images in 3 classes" in first.stdout
    (folder,) = os.listdir(tmp_path)
    assert folder.startswith("synthetic-") and str(tmp_path / folder) in first.stdout
    again = run_cli(*args, FASTLOAD_CACHE=str(tmp_path))
    assert again.returncode == 0 and os.listdir(tmp_path) == [folder]


def test_bench_compares_with_torch_and_plots(tiny_folder, tmp_path, torch):
    plot = tmp_path / "scaling.png"
    done = run_cli("bench", tiny_folder, "--workers", "1", "--batch-size", "8", "--compare", "torch",
                   "--rounds", "2", "--plot", str(plot), "--plot-workers", "0,1", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert rates(done.stdout, "torch (1 workers)")[0] > 0
    assert re.search(r"^fastload / torch\s+[\d.]+x$", done.stdout, re.M)
    assert len(re.findall(r"plot point: (fastload|torch)", done.stdout)) == 4
    with Image.open(plot) as img:
        assert img.format == "PNG" and img.width > 300


def test_bench_progress_bar_goes_to_stderr(tiny_folder):
    done = run_cli("bench", tiny_folder, "--workers", "0", "--batch-size", "8")
    assert done.returncode == 0, done.stderr
    assert "img" in done.stderr and "images/s" not in done.stderr


def test_bench_rejects_bad_arguments(tmp_path):
    missing = run_cli("bench", str(tmp_path / "nowhere"), "--no-progress")
    assert missing.returncode != 0 and "nowhere" in missing.stderr and "not a directory" in missing.stderr
    bad_size = run_cli("bench", "--size", "big", "--no-progress")
    assert bad_size.returncode == 2 and "500x375" in bad_size.stderr
    bad_batch = run_cli("bench", str(tmp_path), "--batch-size", "0", "--no-progress")
    assert bad_batch.returncode != 0 and "--batch-size" in bad_batch.stderr


def test_bench_names_folder_problems_without_a_traceback(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_images = tmp_path / "no_images"
    (no_images / "cat").mkdir(parents=True)
    corrupt = tmp_path / "corrupt"
    (corrupt / "cat").mkdir(parents=True)
    (corrupt / "cat" / "broken.jpg").write_bytes(b"not a jpeg")
    for root, expected in ((empty, f"Couldn't find any class folder in {empty}"),
                           (no_images, f"{no_images}: Found no valid file for the classes cat"),
                           (corrupt, f"cannot load sample 0 from '{corrupt / 'cat' / 'broken.jpg'}'")):
        done = run_cli("bench", str(root), "--workers", "0", "--no-progress")
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(f"fastload bench: {expected}"), done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, expected", [
    (("--plot", "/nonexistent-dir/scaling.png"), "--plot '/nonexistent-dir/scaling.png': directory "
                                                 "'/nonexistent-dir' does not exist"),
    (("--images", "3", "--classes", "5"), "--images (3) must be at least --classes (5)"),
    (("--plot", "scaling.txt"), "--plot 'scaling.txt': matplotlib cannot write '.txt' files; "
                                "use one of "),
])
def test_bench_rejects_options_before_measuring(tiny_folder, args, expected):
    root = () if "--images" in args else (tiny_folder,)
    done = run_cli("bench", *root, *args, "--no-progress")
    assert done.returncode == 1 and expected in done.stderr, done.stderr
    assert "images/s" not in done.stdout  # nothing was measured first


@pytest.mark.parametrize("option, missing", [(("--compare", "torch"), "torch"),
                                             (("--plot", "scaling.png"), "matplotlib")])
def test_bench_says_what_to_install_for_an_option(tiny_folder, tmp_path, monkeypatch, option, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed: find_spec gives None
    monkeypatch.chdir(tmp_path)
    from fastload.__main__ import main

    with pytest.raises(SystemExit, match=rf"{option[0]} .*needs {missing}.*fastload\[bench\]"):
        main(["bench", tiny_folder, *option, "--no-progress"])
    assert os.listdir(tmp_path) == []


def test_bench_draws_a_plain_progress_line_without_tqdm(tiny_folder, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import of tqdm fails, as when not installed
    from fastload.__main__ import main

    assert main(["bench", tiny_folder, "--workers", "0", "--batch-size", "8"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"pipeline, no loader: 40/40 img, \d+ img/s", err), err
    assert re.search(r"fastload, 0 workers: 40/40 img", err), err
    assert err.endswith("\r")  # each line erased when its run ends, as tqdm's leave=False


@pytest.mark.timeout(60)
def test_ctrl_c_ends_the_bench_quietly_and_leaves_nothing_behind(tiny_folder, no_leaks):
    import signal
    import time

    # On a machine with one CPU, --workers 2 also gives torch's worker-count warning.
    env = dict(os.environ, PYTHONPATH=REPO_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore:This DataLoader will create:UserWarning")
    proc = subprocess.Popen([sys.executable, "-m", "fastload", "bench", tiny_folder, "--workers", "2",
                             "--batch-size", "4", "--epochs", "1000", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_DIR,
                            start_new_session=True)
    no_leaks.watch_pid(proc.pid)
    try:
        for line in proc.stdout:
            if line.startswith("limit (x"):  # the loader runs next
                break
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole process group
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "fastload bench: interrupted"


@pytest.mark.parametrize("decode", ["auto", "full", "both-reduced"])
def test_bench_says_which_decode_each_side_used(photo_folder, decode):
    done = run_cli("bench", photo_folder, "--workers", "0", "--batch-size", "4", "--decode", decode,
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    (line,) = [text for text in done.stdout.splitlines() if text.strip().startswith("decode:")]
    fidelity = [text for text in done.stdout.splitlines() if text.strip().startswith("fidelity:")]
    (decoder,) = [text for text in done.stdout.splitlines() if text.strip().startswith("decoder:")]
    assert ("simplejpeg" in decoder) == turbo_decode.available(), decoder
    if decode == "full":
        assert "full on both sides" in line
        assert fidelity == []  # bit-identical by construction: nothing to measure
    else:
        assert re.search(r"fastload reduced-size JPEG decode for \d+% of images \(1/\d", line), line
        if decode == "auto":
            assert "torch full" in line and "--decode full" in line
        else:
            assert "torch's loader Pillow draft to 224x224" in line
        assert re.search(r"mean PSNR \d+\.\d dB \(lowest \d+\.\d\) over the \d+ of \d+ probed",
                         fidelity[0]), fidelity


def test_bench_on_small_images_says_both_decode_in_full(tiny_folder):
    done = run_cli("bench", tiny_folder, "--workers", "0", "--batch-size", "8", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "decode: full on both sides (no crop is large enough" in done.stdout


@pytest.mark.timeout(240)
def test_bench_with_a_cache_reports_epoch_one_and_later_epochs_apart(tiny_folder, tmp_path):
    from fastload.vision.cache import DecodedImageCache

    cache = str(tmp_path / "cache")
    done = run_cli("bench", tiny_folder, "--epochs", "3", "--workers", "2", "--batch-size", "8",
                   "--cache", cache, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert rates(done.stdout, "cache, epoch 1")[0] > 0
    assert rates(done.stdout, "cache, epochs 2-3")[0] > 0
    assert "store then held 40 images" in done.stdout
    store = DecodedImageCache(cache)
    store.refresh()
    assert store.stats()["entries"] == 40
