"""The engine's epoch order: a function of (seed, epoch), each rank its own share (sampling.py)."""

from template_package.engine.data.sampling import EpochShuffleSampler


def test_each_rank_shuffles_its_own_share_anew_every_epoch():
    """Under DDP every rank reads a disjoint share of one (seed, epoch) permutation, and set_epoch changes it."""
    shares = {}
    for epoch in (0, 1):
        ranks = [EpochShuffleSampler(1257, seed=42, num_replicas=2, rank=rank) for rank in (0, 1)]
        for sampler in ranks:
            sampler.set_epoch(epoch)
        shares[epoch] = [list(sampler) for sampler in ranks]
        assert len(shares[epoch][0]) == len(shares[epoch][1]) == 628
        assert not set(shares[epoch][0]) & set(shares[epoch][1])
        whole = EpochShuffleSampler(1257, seed=42)
        whole.set_epoch(epoch)
        order = list(whole)
        assert shares[epoch][0] == order[0:1256:2] and shares[epoch][1] == order[1:1256:2]
    assert shares[0][0] != shares[1][0]
    batched = EpochShuffleSampler(1257, seed=42, batch_size=64, num_replicas=2, rank=1)
    batched.set_epoch(1)
    assert len(batched) == 9 and sum(list(batched), []) == shares[1][1][: 9 * 64]
