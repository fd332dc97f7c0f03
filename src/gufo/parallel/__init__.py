"""Tensor parallelism on torch.distributed: launch checks, shard rules, leader/follower mirroring."""
