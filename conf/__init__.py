# Hydra configs of slurmagent; a package so `pkg://slurmagent.conf` finds them in the wheel.
