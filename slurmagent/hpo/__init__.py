"""Hyperparameter search across Slurm jobs: the search space, the ask/tell optimiser
(explore, focus, asynchronous successive halving with promotions that resume their
checkpoint), its study storage. docs/hpo.md explains it."""
