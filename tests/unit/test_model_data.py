import torch

from train.contract.config import DataConfig, ModelConfig
from train.trainer.data import ShardedSampler, make_dataset
from train.trainer.model import build_mlp, layer_dims, linear_indices


def test_mlp_shapes():
    cfg = ModelConfig(n_layers=3, dim_in=16, dim_hidden=8, n_classes=5)
    model = build_mlp(cfg, seed=0)
    assert layer_dims(cfg) == [(16, 8), (8, 8), (8, 5)]
    assert len(linear_indices(model)) == 3
    assert sum(isinstance(m, torch.nn.ReLU) for m in model) == 2
    assert model(torch.randn(7, 16)).shape == (7, 5)


def test_one_layer_mlp_is_linear():
    model = build_mlp(ModelConfig(n_layers=1, dim_in=4, n_classes=3), seed=0)
    assert len(model) == 1 and model(torch.randn(2, 4)).shape == (2, 3)


def test_init_is_deterministic_from_seed():
    a, b, c = (build_mlp(ModelConfig(), s) for s in (1, 1, 2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a[0].weight, c[0].weight)


def test_data_is_deterministic_and_seeded():
    small = DataConfig(train_size=100, test_size=50)
    a, b = make_dataset(small, ModelConfig()), make_dataset(small, ModelConfig())
    c = make_dataset(DataConfig(train_size=100, test_size=50, seed=1), ModelConfig())
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_train, c.x_train)
    assert a.x_train.shape == (100, 1024) and int(a.y_train.max()) < 32


def test_shards_union_is_the_single_process_batch():
    single = ShardedSampler(1000, 64, seed=3)
    for dp, accum in [(2, 1), (4, 1), (2, 2), (4, 4)]:
        shards = [ShardedSampler(1000, 64, 3, r, dp, accum) for r in range(dp)]
        for step in (0, 5, 15, 16, 40):  # 15 steps per epoch: crosses epochs
            parts = [s.indices(step, m) for s in shards for m in range(accum)]
            assert all(len(p) == 64 // dp // accum for p in parts)
            assert sorted(torch.cat(parts).tolist()) == sorted(single.indices(step).tolist())


def test_shards_are_disjoint_and_epochs_reshuffle():
    a, b = ShardedSampler(1000, 64, 0, 0, 2), ShardedSampler(1000, 64, 0, 1, 2)
    assert not set(a.indices(0).tolist()) & set(b.indices(0).tolist())
    single = ShardedSampler(1000, 64, 0)
    assert not torch.equal(single.indices(0), single.indices(15))  # step 15 starts epoch 1


def test_distributed_sampler_semantics():
    """With one micro-step, rank r's shard is DistributedSampler's rank r of the epoch's permutation."""
    s = ShardedSampler(1000, 64, 0, dp_rank=1, dp_size=4)
    perm = s.permutation(0)
    assert torch.equal(s.indices(2), perm[1::4][2 * 16 : 3 * 16])


def test_an_epoch_resharded_midway_still_sees_every_sample_once():
    """What a resume on another rank count relies on: 4 ranks for the first steps of the
    epoch, then 3, then 1 (train.batch_size=48): each step's global batch is the one process's,
    and the epoch reads every sample exactly once."""
    n, batch = 480, 48
    single = ShardedSampler(n, batch, seed=0)
    seen = []
    for step in range(n // batch):
        dp = 4 if step < 4 else 3 if step < 7 else 1
        ranks = [ShardedSampler(n, batch, 0, r, dp).indices(step) for r in range(dp)]
        assert sorted(torch.cat(ranks).tolist()) == sorted(single.indices(step).tolist())
        seen += torch.cat(ranks).tolist()
    assert sorted(seen) == list(range(n))
