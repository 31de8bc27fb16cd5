"""harness/kernels/fused/greedy.py: the greedy feed of a graph of several fused steps."""
from __future__ import annotations

import pytest
import torch

from harness.kernels.fused.knobs import KNOBS


@pytest.mark.slow
def test_the_greedy_kernel_feeds_torch_argmax_the_first_index_among_equals():
    """A graph of several fused steps feeds each step's argmax by a kernel of its own: the same token as
    torch.argmax where equals fall in two loads of one program or in two programs, at the vocabulary's short end,
    for a NaN and for a row all -inf."""
    from harness.kernels.fused.greedy import GreedyFeed

    block = KNOBS.greedy_block
    vocab = 151936  # Qwen3's: 50 programs of 3 loads, the last program short
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    logits[0, [5, block + 5]] = 9.0  # equal largest in two loads of one program
    logits[1, [3 * block + 7, 9 * block + 1]] = 9.0  # in two programs
    logits[2, [11, 12]] = 9.0  # in one load
    logits[3, vocab - 1] = 9.0  # the last logit
    ids, tokens = torch.full((4, 1), -1, dtype=torch.long), torch.full((4,), -1, dtype=torch.long)
    greedy = GreedyFeed(logits, ids, pdl=False)
    assert (greedy.programs, greedy.span) == (50, 3 * block)
    greedy(tokens)
    assert tokens.tolist() == logits.argmax(-1).tolist() == [5, 3 * block + 7, 11, vocab - 1]
    assert ids[:, 0].tolist() == tokens.tolist()  # fed: the next step's input
    assert greedy.count.tolist() == [0] * 4  # each row's count back to 0 for the next step
    logits[1, 2 * block + 3], logits[3] = float("nan"), float("-inf")
    greedy(tokens)
    assert tokens.tolist() == logits.argmax(-1).tolist() == [5, 2 * block + 3, 11, 0]
