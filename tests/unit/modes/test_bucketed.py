"""The bucketed mode (harness/modes/bucketed.py): the bucket a batch replays."""
from __future__ import annotations

import pytest

from harness.modes.bucketed import pick_bucket

pytestmark = pytest.mark.usefixtures("fresh_model_cache")


@pytest.mark.parametrize("bs, bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (32, 32), (33, None)])
def test_a_batch_replays_the_smallest_bucket_that_holds_it(bs, bucket):
    assert pick_bucket([1, 2, 4, 8, 16, 32], bs) == bucket
