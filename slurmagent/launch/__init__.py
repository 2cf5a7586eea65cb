"""Launching sweeps: the Hydra launcher, the backends, and what runs inside each job."""
