"""The same trivial task as a plain Hydra app, launched by hydra-submitit-launcher 1.2.0."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> int:
    return int(cfg.bench.i)


if __name__ == "__main__":
    main()
