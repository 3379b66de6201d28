"""The shard plan and the cost model: pure arithmetic."""

from __future__ import annotations

import pytest

from hypertf.offload.plan import DEPTH, ROWS, CostModel, make_plan, shard_rows


def covered(plan, batch, m, k):
    cells = set()
    for s in plan.shards:
        for row in range(s.row0, s.row1):
            for depth in range(s.k0, s.k1):
                assert (s.batch, row, depth) not in cells, "a cell computed twice"
                cells.add((s.batch, row, depth))
    return len(cells) == batch * m * k


@pytest.mark.parametrize(("batch", "m", "k", "n", "workers"), [
    (1, 100, 70, 50, 2), (3, 33, 20, 17, 4), (1, 1, 1, 1, 1), (2, 1000, 8, 3, 3)])
def test_row_split_covers_every_row_once(batch, m, k, n, workers):
    plan = make_plan(batch, m, k, n, workers)
    assert plan.split == ROWS and not plan.accumulate
    assert covered(plan, batch, m, k)
    assert [s.index for s in plan.shards] == list(range(len(plan.shards)))


def test_few_rows_and_deep_k_split_along_k_with_accumulation():
    plan = make_plan(1, 2, 5000, 3, workers=2)
    assert plan.split == DEPTH and plan.accumulate
    assert len(plan.shards) == 4
    assert covered(plan, 1, 2, 5000)


def test_two_shards_per_worker_at_least_for_the_pipeline():
    assert len(make_plan(1, 1024, 1024, 1024, workers=4).shards) >= 8


def test_shard_size_grows_when_messages_are_dear():
    cheap = CostModel(host_flops=1e10, local_flops=1e10, link_bytes_s=1e9, message_s=1e-6)
    dear = CostModel(host_flops=1e10, local_flops=1e10, link_bytes_s=1e9, message_s=1e-2)
    assert shard_rows(4096, 64, 64, 4, dear) > shard_rows(4096, 64, 64, 4, cheap)


def test_empty_products_are_refused():
    with pytest.raises(ValueError):
        make_plan(1, 0, 3, 3, 2)


def test_the_model_predicts_a_crossover_and_a_speedup():
    # 4 hosts x 64 cores (~1 Tflop/s each) on 25 Gb/s, beside one such host computing locally
    model = CostModel(host_flops=1e12, local_flops=1e12, link_bytes_s=25e9 / 8)
    n = model.crossover(hosts=4)
    assert n is not None and 256 < n < 65536
    assert model.speedup(n - 1, 4) <= 1.0 < model.speedup(n, 4)
    assert 1.0 < model.speedup(16384, 4) < 4.0
    slow_link = CostModel(host_flops=1e12, local_flops=1e12, link_bytes_s=1e6)
    assert slow_link.crossover(hosts=4, limit=4096) is None
