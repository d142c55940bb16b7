"""The ``vision`` family: images (Fashion-MNIST, sklearn digits, or an ImageFolder tree) with a
:class:`~primal_attention.models.vision.VisionTransformer`, augmented per step."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import torch

from primal_attention.data.base import Batch
from primal_attention.models.vision import VisionTransformer, ViTConfig
from primal_attention.train.config import ConfigError, ExperimentConfig, VisionModelConfig
from primal_attention.train.families.base import (Family, Splits, attention_pattern, model_fields,
                                                  check_loader_options, register_family)
from primal_attention.train.families.classification import classification_baselines, holdout_splits
from primal_attention.train.tasks import CLASSIFICATION

#: data.name of the vision family.
IMAGE_DATASETS = ("fashion_mnist", "digits", "image_folder")
#: data.options that are augmentation settings, not loader arguments.
AUGMENT_OPTIONS = ("crop_padding", "flip")


@dataclass(frozen=True)
class ImageStandIn:
    """What a vision transformer is built from, without the data."""

    num_classes: int
    image_size: int
    in_channels: int


@register_family("vision")
class VisionFamily(Family):
    model_section = VisionModelConfig
    task = CLASSIFICATION

    def check(self, cfg: ExperimentConfig) -> None:
        if cfg.data.name not in IMAGE_DATASETS:
            raise ConfigError(f"data.name: vision dataset must be one of {', '.join(IMAGE_DATASETS)}, got {cfg.data.name!r}")
        if cfg.data.name == "image_folder" and cfg.data.data_dir is None:
            raise ConfigError("data.name=image_folder needs data.data_dir (a folder with train/ and test/ class folders)")
        from primal_attention.data import vision

        loader = {"fashion_mnist": vision.load_fashion_mnist_images, "digits": vision.load_digits_images,
                  "image_folder": vision.load_image_folder}[cfg.data.name]
        check_loader_options(cfg.data.options, loader, "vision", extra=AUGMENT_OPTIONS)

    def load(self, cfg: ExperimentConfig) -> Splits:
        from primal_attention.data import vision

        d = cfg.data
        options = {k: v for k, v in d.options.items() if k not in AUGMENT_OPTIONS}
        if d.name == "fashion_mnist":
            pair = [vision.load_fashion_mnist_images(split, **options) for split in ("train", "test")]
        elif d.name == "digits":
            pair = [vision.load_digits_images(split, **options) for split in ("train", "test")]
        else:  # every split numbered by train/'s class folders
            pair = [vision.load_image_folder(d.data_dir, split, **options) for split in ("train", "test")]
        return holdout_splits(cfg, *pair)

    def build_model(self, cfg: ExperimentConfig, data: Any) -> VisionTransformer:
        return VisionTransformer(ViTConfig(num_classes=data.num_classes, image_size=data.image_size,
                                           in_channels=data.in_channels, attention=attention_pattern(cfg),
                                           **model_fields(cfg.model)))

    def stand_in(self, cfg: ExperimentConfig) -> ImageStandIn:
        size = cfg.data.options.get("image_size") or {"fashion_mnist": 28, "digits": 8}.get(cfg.data.name, 224)
        channels = 1 if cfg.data.name in ("fashion_mnist", "digits") else 3
        return ImageStandIn(num_classes=2, image_size=size, in_channels=channels)

    def train_batch(self, cfg: ExperimentConfig, data: Any, index: torch.Tensor, step: int) -> Batch:
        """Images get the augmentation of ``data.options`` (random crop after padding, horizontal flip)
        drawn from a generator seeded by (seed, step), so a resumed run sees exactly the same batches."""
        from primal_attention.data.vision import augment

        batch = data.batch(index)
        options = {k: cfg.data.options[k] for k in AUGMENT_OPTIONS if k in cfg.data.options}
        if options.get("crop_padding", 4) == 0 and not options.get("flip", True):
            return batch
        generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + step)
        batch.x = augment(batch.x, generator=generator, **options)
        return batch

    def trivial_baselines(self, cfg: ExperimentConfig, splits: Splits) -> dict[str, dict[str, Any]]:
        return classification_baselines(splits, cfg.train.seed)
