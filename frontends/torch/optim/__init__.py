"""Optimizers: DistributedOptimizer (distributed_optimizer) and its base
(optimizer), the gradient exchange they share (_grad_exchange), Adasum,
PowerSGD, delayed averaging with weight prediction, local SGD / DiLoCo with
streaming, sparse-as-dense, memory_report, and the recognition of torch
optimizers for commlib.DistributedOptimizer (_dispatch). Nothing is imported
here."""
