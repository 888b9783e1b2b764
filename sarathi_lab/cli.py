"""`sarathi-lab`: one run (or a Hydra multirun sweep) from the command line."""
from __future__ import annotations

import logging
import os

import hydra
from omegaconf import DictConfig

log = logging.getLogger("sarathi_lab")


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def _main(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from sarathi_lab.runner import format_summary, run
    run_dir = HydraConfig.get().runtime.output_dir
    summary = run(cfg, run_dir)
    print(format_summary(summary))
    print(f"\nrun directory: {os.path.abspath(run_dir)}")
    return summary


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _main()


if __name__ == "__main__":
    main()
