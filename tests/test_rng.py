"""``SeedSource`` built from ``None`` with torch imported: its draws are torch's default
generator's, its quiet draws leave that generator alone, and its state replays them."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from fastload.rng import SeedSource


def torch_draw(torch) -> int:
    return int(torch.empty((), dtype=torch.int64).random_().item())


def test_a_draw_is_the_draw_torch_makes(torch):
    torch.manual_seed(4)
    expected = [torch_draw(torch) for _ in range(3)]
    torch.manual_seed(4)
    source = SeedSource(None)
    assert [source.draw() for _ in range(3)] == expected


def test_sources_made_from_one_share_its_draws(torch):
    torch.manual_seed(4)
    expected = [torch_draw(torch) for _ in range(2)]
    torch.manual_seed(4)
    loader_source = SeedSource(None)
    sampler_source = SeedSource(loader_source)
    assert [loader_source.draw(), sampler_source.draw()] == expected
    assert sampler_source.given is None


def test_a_quiet_draw_leaves_torchs_generator_alone_and_repeats(torch):
    def quiet(seed):
        torch.manual_seed(seed)
        source = SeedSource(None)
        source.draw()
        values = [source.draw_quiet(), source.draw_quiet()]
        return values, torch.rand(1).item()

    torch.manual_seed(1)
    torch_draw(torch)
    after_one = torch.rand(1).item()
    (values, after), again = quiet(1), quiet(1)
    assert after == after_one  # only the first, real draw came from torch
    assert (values, after) == again and values[0] != values[1]
    assert quiet(2)[0] != values
    assert all(0 <= v < 1 << 63 for v in values)


def test_an_op_runs_on_torchs_generator_and_only_with_none(torch):
    torch.manual_seed(6)
    expected = torch.randperm(10).tolist()
    torch.manual_seed(6)
    op = lambda t, g: t.randperm(10, generator=g)  # noqa: E731
    assert SeedSource(None).run_on_torch_default(op).tolist() == expected
    for generator in (0, np.random.default_rng(0), torch.Generator()):
        assert SeedSource(generator).run_on_torch_default(op) is None


def test_a_state_replays_the_draws_since_it_was_taken_without_touching_torch(torch):
    torch.manual_seed(2)
    source = SeedSource(None)
    state = source.get_state()
    op = lambda t, g: t.randperm(8, generator=g)  # noqa: E731
    drawn = [source.draw(), source.run_on_torch_default(op).tolist(), source.draw_quiet()]
    frozen = pickle.loads(pickle.dumps(state))
    assert frozen[0] == "torch.default_generator" and isinstance(frozen[1], tuple)
    after = torch.get_rng_state()

    other = SeedSource(None)
    other.set_state(frozen)
    replayed = [other.draw(), other.run_on_torch_default(op).tolist(), other.draw_quiet()]
    assert replayed == drawn
    assert torch.equal(torch.get_rng_state(), after)  # the replay drew nothing from torch
    assert other.draw() == torch_draw_after(torch, after)  # then torch's again


def torch_draw_after(torch, state) -> int:
    generator = torch.Generator()
    generator.set_state(state)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def test_a_state_taken_while_replaying_holds_what_is_left(torch):
    torch.manual_seed(2)
    source = SeedSource(None)
    state = source.get_state()
    values = [source.draw(), source.draw()]
    other = SeedSource(None)
    other.set_state(pickle.loads(pickle.dumps(state)))
    whole = other.get_state()
    other.draw()
    rest = other.get_state()
    other.draw()
    assert pickle.loads(pickle.dumps(whole))[1] == tuple(values)
    assert pickle.loads(pickle.dumps(rest))[1] == (values[1],)


def test_a_state_taken_without_torch_keeps_its_os_entropy_stream(torch):
    # As it would be in a process without torch: the numpy stream's state.
    source = SeedSource(None)
    numpy_state = ("numpy", source._numpy.bit_generator.state)
    expected = [int(source._numpy.integers(0, 1 << 63, dtype=np.int64)) for _ in range(2)]
    other = SeedSource(None)
    other.set_state(numpy_state)
    before = torch.get_rng_state()
    assert [other.draw(), other.draw()] == expected
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("values", [("x",), [1 << 63], [-1], [True], 5])
def test_a_broken_draw_record_is_refused(torch, values):
    with pytest.raises(ValueError, match="not a state of torch's default generator"):
        SeedSource(None).set_state(("torch.default_generator", values))


def test_a_replay_of_the_wrong_kind_is_refused(torch):
    source = SeedSource(None)
    source.set_state(("torch.default_generator", (5,)))
    with pytest.raises(ValueError, match="does not fit"):
        source.run_on_torch_default(lambda t, g: t.randperm(3, generator=g))
