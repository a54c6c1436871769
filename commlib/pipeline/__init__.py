"""Framework-free pieces of pipeline parallelism: the tags of gradient
messages (``tags``); the schedules as data, one list of actions per rank
(``actions``, ``schedules``); and the checker that simulates every rank's
list before the first step (``checker``). The frontends run the lists on
tensors (commlib.torch.pipelining)."""
