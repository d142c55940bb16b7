"""Training: configs, the loop, checkpoints."""

from primal_attention.train.config import ConfigError, ExperimentConfig
from primal_attention.train.load import load_config
from primal_attention.train.tasks import evaluate
from primal_attention.train.trainer import Trainer, run_seeds

__all__ = ["ConfigError", "ExperimentConfig", "Trainer", "evaluate", "load_config", "run_seeds"]
