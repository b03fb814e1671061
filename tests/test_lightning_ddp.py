"""fastload under PyTorch Lightning's ``Trainer(strategy="ddp", devices=2, accelerator="cpu")``.

Lightning gives a ``DistributedSampler`` only to torch's own DataLoader: with a
plain fastload loader both ranks train on every sample.  The test runs one
script the way a user would (Lightning's launcher starts the second rank; gloo on
127.0.0.1) and checks, on each rank:

* a plain loader warns (once) that its sampler does not shard, and indeed gives
  both ranks all the samples;
* README's recipe (``fl.DistributedSampler`` built in ``train_dataloader()``, a
  ``generator=`` seed, the epoch set there too) gives the ranks disjoint shares
  whose union is the dataset, every epoch, with Lightning's per-epoch
  ``set_epoch`` reaching fastload's sampler;
* a checkpoint taken mid-epoch (Lightning saves and restores the loader's
  ``state_dict``) resumes that epoch and the later one exactly: the same samples
  and the same worker seeds (what random augmentations draw from) as the
  uninterrupted run;
* a checkpoint taken at an epoch's end (ModelCheckpoint's default; Lightning
  then restores no loader state) resumes the later epochs' samples exactly (their
  worker seeds start again from the generator's seed: not asserted).

Each sample reports its index and its worker's seed, so a rank's record says
what it trained on and with which randomness.
"""

from __future__ import annotations

import json
import sys

import pytest
from ranks import run_launcher
from required import require_installed

SCRIPT = r'''
import json, os, sys, warnings
import numpy as np
import torch
import pytorch_lightning as pl
import fastload as fl

OUT, ROOT = sys.argv[1], sys.argv[2]
N, SEED = 12, 11


class Indexed(fl.Dataset):
    """Sample i: an input, its index, and its worker's seed."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.float32(i), np.int64(i), np.int64(fl.get_worker_info().seed)


def environment():
    return {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")}


def plain_loader(module):
    module.built_with = {"environment": environment()}
    return fl.DataLoader(Indexed(), batch_size=4, num_workers=1, output="torch")


def recipe_loader(module):
    """README's recipe."""
    dataset = Indexed()
    sampler = fl.DistributedSampler(dataset, seed=5)
    # Lightning 2.6 makes a resumed run's first iterator before its own set_epoch
    # (Lightning-AI/pytorch-lightning#21938), and current_epoch lags then.
    sampler.set_epoch(module.trainer.fit_loop.epoch_progress.current.processed)
    module.built_with = {"environment": environment(),
                         "sampler": [sampler.rank, sampler.num_replicas]}
    return fl.DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=1,
                         generator=SEED, output="torch")


class Model(pl.LightningModule):
    def __init__(self, make_loader):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.make_loader = make_loader
        self.seen = []
        self.built_with = None

    def train_dataloader(self):
        self.loader = self.make_loader(self)
        return self.loader

    def training_step(self, batch, _):
        x, index, seed = batch
        self.seen.append([self.current_epoch, getattr(self.loader.sampler, "epoch", None),
                          index.tolist(), seed.tolist()])
        return self.layer(x.view(-1, 1)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Save(pl.Callback):
    """Checkpoints where ModelCheckpoint takes them: at the end of epoch 0 (its default) and
    in the middle of epoch 1 (``every_n_train_steps``)."""

    def __init__(self, end, step, middle):
        self.end, self.step, self.middle = end, step, middle

    def on_train_epoch_end(self, trainer, _):
        if trainer.current_epoch == 0:
            trainer.save_checkpoint(self.end)

    def on_train_batch_end(self, trainer, *_):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.middle)


def fit(make_loader, ckpt_path=None, callbacks=(), **limits):
    model = Model(make_loader)
    trainer = pl.Trainer(strategy="ddp", devices=2, accelerator="cpu", enable_progress_bar=False,
                         logger=False, enable_checkpointing=False, enable_model_summary=False,
                         default_root_dir=ROOT, callbacks=list(callbacks), **limits)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, ckpt_path=ckpt_path)
    found = [str(w.message) for w in caught if "this process is one of" in str(w.message)]
    return trainer.global_rank, {"seen": model.seen, "warnings": found,
                                 "built_with": model.built_with}


result = {}
rank, result["plain"] = fit(plain_loader, max_epochs=1)
_, result["whole"] = fit(recipe_loader, max_epochs=3)
middle, end = os.path.join(ROOT, "middle.ckpt"), os.path.join(ROOT, "end.ckpt")
fit(recipe_loader, callbacks=[Save(end, 4, middle)], max_epochs=2)  # 4: epoch 1's first batch
_, result["from_middle"] = fit(recipe_loader, ckpt_path=middle, max_epochs=3)
_, result["from_end"] = fit(recipe_loader, ckpt_path=end, max_epochs=3)
with open(OUT % rank, "w") as f:
    json.dump(result, f)
'''

EPOCHS, BATCHES = 3, 3  # 12 samples, 2 ranks, batches of 2


@pytest.fixture
def lightning(torch):
    """PyTorch Lightning, a test dependency the ranks import (tests/required.py)."""
    require_installed("pytorch_lightning")


def indices(record):
    return [index for _, _, batch, _ in record["seen"] for index in batch]


@pytest.mark.timeout(180)
def test_fastload_under_lightning_ddp(lightning, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = str(tmp_path / "rank-%d.json")
    # Lightning's launcher picks its own port by binding and closing a socket; if
    # another process takes it before rank 0's store binds it, run again.
    for attempt in range(3):
        try:
            run_launcher([sys.executable, str(script), out, str(tmp_path)], timeout=150,
                         what="Lightning ddp x2")
            break
        except AssertionError as failure:
            if "address already in use" not in str(failure).lower() or attempt == 2:
                raise
    ranks = [json.load(open(out % rank)) for rank in range(2)]

    for number, rank in enumerate(ranks):
        # Lightning's launcher sets no RANK, and its teardown after a fit deletes
        # WORLD_SIZE: the process group told the later fits' samplers their rank.
        assert rank["plain"]["built_with"]["environment"] == {
            "RANK": None, "WORLD_SIZE": "2", "LOCAL_RANK": str(number), "NODE_RANK": "0"}
        built_with = rank["whole"]["built_with"]
        assert built_with["environment"]["RANK"] is None
        assert built_with["sampler"] == [number, 2]
        # A plain loader: one warning per rank, and truly every sample on every rank.
        assert len(rank["plain"]["warnings"]) == 1
        assert "one of 2 ranks" in rank["plain"]["warnings"][0]
        assert sorted(indices(rank["plain"])) == list(range(12))
        for name in ("whole", "from_middle", "from_end"):
            assert rank[name]["warnings"] == [], name

    # The recipe: each epoch, shares that are disjoint and cover the dataset, and
    # Lightning's set_epoch reached the sampler (the order changes with the epoch).
    whole = [rank["whole"]["seen"] for rank in ranks]
    for epoch in range(EPOCHS):
        shares = [[i for e, _, batch, _ in seen if e == epoch for i in batch] for seen in whole]
        assert len(shares[0]) == len(shares[1]) == 6
        assert sorted(shares[0] + shares[1]) == list(range(12)), epoch
    for seen in whole:
        assert [sampler_epoch for _, sampler_epoch, _, _ in seen] == \
            [epoch for epoch in range(EPOCHS) for _ in range(BATCHES)]
        assert len({tuple(batch) for _, _, batch, _ in seen}) > BATCHES  # epochs differ
        assert len({seed[0] for _, _, _, seed in seen}) == EPOCHS  # a base seed per epoch

    for rank, seen in zip(ranks, whole):
        # Mid-epoch checkpoint: the rest of epoch 1 and epoch 2, exactly (samples and seeds).
        assert rank["from_middle"]["seen"] == seen[BATCHES + 1:]
        # End-of-epoch checkpoint: epochs 1 and 2 with the same samples.
        resumed = rank["from_end"]["seen"]
        assert [(e, batch) for e, _, batch, _ in resumed] == \
            [(e, batch) for e, _, batch, _ in seen[BATCHES:]]
