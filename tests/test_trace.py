"""`gather_vocab`: the raw-logits path under vLLM tensor parallelism, with the world size faked.

vLLM splits the unembedding by vocab rows across the tensor-parallel ranks, each rank holding one
contiguous shard of the vocab padded up to a multiple of its padding size; the all-gather concatenates
the shards in rank order and the padding columns are dropped. Here two "ranks" hold the shards of a
known logit matrix and a fake all-gather concatenates them, as NCCL/gloo would.
"""

import pytest
import torch

from lensapp.engine.run.stages import gather_vocab

VOCAB, PADDED, WORLD = 10, 16, 2        # 10 real tokens, padded to 16: 8 columns per rank, the last 6 padding


def sharded_logits(tokens: int = 3):
    torch.manual_seed(0)
    full = torch.randn(tokens, PADDED)
    full[:, VOCAB:] = 1e4          # padding rows of W_U are zeros in vLLM; a loud value shows if any survive
    return full, list(full.chunk(WORLD, dim=-1))


@pytest.mark.parametrize("rank", range(WORLD))
def test_two_ranks_gather_the_whole_vocab_without_padding(rank):
    full, shards = sharded_logits()
    calls = []

    def all_gather(local):
        calls.append(local.shape)
        assert torch.equal(local, shards[rank])
        return torch.cat(shards, dim=-1)

    out = gather_vocab(shards[rank], VOCAB, world_size=WORLD, all_gather=all_gather)
    assert calls == [(3, PADDED // WORLD)]
    assert out.shape == (3, VOCAB)
    assert torch.equal(out, full[:, :VOCAB])
    assert out.max() < 1e4


def test_batched_rows_keep_their_leading_dims():
    full = torch.randn(2, 5, PADDED)
    shards = list(full.chunk(WORLD, dim=-1))
    out = gather_vocab(shards[0], VOCAB, world_size=WORLD, all_gather=lambda local: torch.cat(shards, dim=-1))
    assert torch.equal(out, full[..., :VOCAB])


def test_one_rank_only_trims():
    full, _ = sharded_logits()

    def no_gather(local):
        raise AssertionError("a single rank has nothing to gather")

    assert torch.equal(gather_vocab(full, VOCAB, world_size=1, all_gather=no_gather), full[:, :VOCAB])
