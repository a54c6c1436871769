"""Collectives on torch tensors, one module per family (allreduce_ops,
gather_ops, reducescatter_ops, sparse_allreduce, p2p), their handles and
tensor conversion (handles, tensor_io), Compression, and the model-level
broadcasts (state_sync). commlib.torch and commlib.torch.mpi_ops re-export
the public names. Nothing is imported here (cuda/ imports handles and
tensor_io, and collectives import cuda/)."""
