"""Sharded training: ZeRO stages 1-3 (zero, zero_buckets, zero_pieces,
zero_state, zero_checkpoint) and fully_shard (fully_shard,
fully_shard_checkpoint), on commlib.sharding's framework-free bucket plan.
Nothing is imported here."""
