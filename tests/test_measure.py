"""rn50_mx.measure on real data: the ResNet-50 step on real .rec batches and on synthetic ones."""
import mxnet as mx
import pytest

from rn50_mx import measure
from rn50_mx.errors import InputError
from tests.support.settings import small_settings


def test_synthetic_vs_real_times_both_sources(small_rec):
    rates = measure.synthetic_vs_real(small_settings(small_rec), mx.cpu(), rounds=1, steps=2)
    assert set(rates) == {"synthetic", "real"}
    for r in rates.values():
        assert r.images_per_s > 0 and r.images_per_cpu_s > 0 and 0 <= r.wait_share < 1


def test_compare_counts_rounds_and_steps_of_each_contender(small_rec):
    """Every contender takes DRAIN + steps batches per round, the uncounted first round included."""
    s = small_settings(small_rec)
    taken = {"a": 0, "b": 0}

    def counting(name):
        def batches():
            for batch in measure.sources(s, mx.cpu())["real"]:
                taken[name] += 1
                yield batch
        return batches()

    def step(batch):
        return batch.label[0].sum()

    seen = []
    medians = measure.compare({"a": (step, counting("a")), "b": (step, counting("b"))}, s.batch_size, rounds=2,
                              steps=3, on_round=lambda r, rates: seen.append((r, len(rates["a"]))))
    assert taken == {"a": 3 * (measure.DRAIN + 3), "b": 3 * (measure.DRAIN + 3)}
    assert seen == [(1, 1), (2, 2)]
    assert set(medians) == {"a", "b"} and all(isinstance(m, measure.Rate) for m in medians.values())


def test_missing_train_file_fails_before_building(tmp_path):
    with pytest.raises(InputError, match="missing.rec"):
        measure.sources(small_settings(str(tmp_path / "missing")), mx.cpu())


def test_the_untimed_steps_outnumber_the_prefetched_batches():
    """The self-test's real batches are timed after more steps than DALI prefetches (the shipped configs prefetch
    5 and 15), so that they are decoded while timed, not taken from a full queue."""
    from rn50_mx.config import Settings

    assert [measure.drain_for(Settings(dali_prefetch_queue=depth)) for depth in (1, 2, 5, 15)] == [3, 3, 6, 16]
