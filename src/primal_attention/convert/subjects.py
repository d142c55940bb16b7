"""What a conversion works on: a trained model, its data, its task loss and its metrics.

A :class:`Subject` hides whether the model is one of ours (a run folder of ``primal train``) or a
Hugging Face causal LM with a tensor of token blocks. The stages of :mod:`primal_attention.convert.stages`
ask it for the attention module of every layer, a training batch at a step, the task loss and an
evaluation; nothing else there knows which kind of model it is.
"""

from __future__ import annotations

import copy
import math
import shutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.primal import PrimalAttention


class ConvertError(ValueError):
    """The model, the layers or the options cannot be converted (one line, says what and why)."""


def resolve_layers(layers: str | int | Sequence[int], count: int) -> list[int]:
    """"last", "all", an int or a list of ints (negative counts from the end) -> sorted indices."""
    if layers == "all":
        return list(range(count))
    if layers == "last":
        return [count - 1]
    if isinstance(layers, str):
        try:
            layers = [int(p) for p in layers.split(",") if p.strip()]
        except ValueError:
            raise ConvertError(f"layers must be 'last', 'all' or comma-separated ints, got {layers!r}") from None
    chosen = [layers] if isinstance(layers, int) else list(layers)
    if not chosen:
        raise ConvertError("layers is empty")
    out = []
    for i in chosen:
        if not isinstance(i, int) or isinstance(i, bool):
            raise ConvertError(f"layer indices must be ints, got {i!r}")
        if not -count <= i < count:
            raise ConvertError(f"layer {i} is out of range for a model with {count} layers (valid: {-count}..{count - 1})")
        out.append(i % count)
    if len(set(out)) != len(out):
        raise ConvertError(f"layers {chosen} name a layer twice")
    return sorted(out)


def output_tensor(output: Any) -> Tensor:
    """An attention module's output: ours return the tensor, HF's ``(output, weights)``."""
    return output[0] if isinstance(output, tuple) else output


class Subject(ABC):
    """A trained model with its data. ``original`` stays frozen in eval mode (the teacher)."""

    original: nn.Module
    device: torch.device
    #: the metric that selects fine-tuning weights on validation, and its direction.
    select: str = "loss"
    maximize: bool = False
    #: the metrics reported per split.
    reported: tuple[str, ...] = ("loss",)
    default_batch_size: int = 16
    default_seed: int = 0

    @abstractmethod
    def attention_modules(self, model: nn.Module) -> list[nn.Module]:
        """Every layer's self-attention module of ``model``, in layer order (softmax or primal)."""

    @abstractmethod
    def is_primal(self, module: nn.Module) -> bool:
        """Whether a module of :meth:`attention_modules` is already a primal layer."""

    @abstractmethod
    def is_softmax(self, module: nn.Module) -> bool:
        """Whether a module of :meth:`attention_modules` is a softmax layer this subject can convert."""

    @abstractmethod
    def convert(self, layers: list[int], options: dict[str, Any]) -> nn.Module:
        """A copy of the original with ``layers`` primal, initialised from the softmax layers they replace."""

    @abstractmethod
    def batch(self, step: int, batch_size: int, seed: int) -> Any:
        """The training batch at optimiser step ``step`` (a pure function of seed and step)."""

    @abstractmethod
    def forward(self, model: nn.Module, batch: Any) -> Any:
        """Run the model on a batch; the output :meth:`task_loss` takes."""

    @abstractmethod
    def task_loss(self, output: Any, batch: Any) -> Tensor:
        """The mean task loss (cross-entropy) of a batch."""

    @abstractmethod
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float] | None:
        """Metrics of ``model`` on split "val" or "test", None when the split does not exist."""

    @abstractmethod
    def eval_batches(self, split: str, limit: int) -> list[Any]:
        """Up to ``limit`` examples of a split, as batches (for layer-output errors)."""

    @abstractmethod
    def save(self, model: nn.Module, out: Path, layers: list[int], options: dict[str, Any]) -> None:
        """Write the converted model so that it loads without this package's convert code."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What identifies the source (for the report and for checking a resumed conversion)."""

    def checkpoint_config(self, layers: list[int], options: dict[str, Any]) -> dict[str, Any] | None:
        """The config recorded in the converted model's checkpoints (None: nothing to record)."""
        return None

    def layer_count(self) -> int:
        return len(self.attention_modules(self.original))

    def check_layers(self, layers: str | int | Sequence[int]) -> list[int]:
        """Resolve ``layers``; ConvertError if one of them is already primal or none is softmax."""
        modules = self.attention_modules(self.original)
        if not any(self.is_softmax(m) for m in modules):
            kinds = sorted({"primal" if self.is_primal(m) else type(m).__name__ for m in modules})
            raise ConvertError(f"the model has no softmax attention layers to convert (its layers: {', '.join(kinds)})")
        chosen = resolve_layers(layers, len(modules))
        softmax = [i for i, m in enumerate(modules) if self.is_softmax(m)]
        for i in chosen:
            if self.is_primal(modules[i]):
                raise ConvertError(f"layer {i} is already primal; choose among the softmax layers {softmax}")
            if i not in softmax:
                raise ConvertError(f"layer {i} is {type(modules[i]).__name__}, not softmax attention; only softmax "
                                   f"layers are converted (here: {softmax})")
        return chosen


def _epoch_order(seed: int, epoch: int, size: int) -> Tensor:
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(size, generator=g)


def _batch_index(step: int, size: int, batch_size: int, seed: int) -> Tensor:
    per_epoch = math.ceil(size / batch_size)
    epoch, k = divmod(step, per_epoch)
    return _epoch_order(seed, epoch, size)[k * batch_size : (k + 1) * batch_size]


class RunSubject(Subject):
    """A run folder of ``primal train`` (a seed's directory or a ``ckpt-*`` directory): its model with
    the val-selected weights, its config, its data splits and its task."""

    def __init__(self, path: str | Path) -> None:
        from primal_attention.train.checkpoint import CheckpointError
        from primal_attention.train.families import get_family
        from primal_attention.train.run import load_run

        path = Path(path)
        if path.suffix in (".yaml", ".yml"):
            raise ConvertError(f"{path} is a config, not a trained run; train it first with primal train")
        seeds = sorted(p.name for p in path.glob("seed_*") if (p / "config.yaml").is_file()) if path.is_dir() else []
        if seeds and not (path / "config.yaml").is_file():
            raise ConvertError(f"{path} holds the runs {', '.join(seeds)}; give one of them, e.g. {path / seeds[0]}")
        try:
            run = load_run(path)
        except CheckpointError as err:
            raise ConvertError(f"{path} is not a trained run ({err})") from err
        self.run = run
        self.cfg = run.cfg
        self.splits = run.splits
        self.device = run.device
        self.original = run.model.eval().requires_grad_(False)
        self.task = get_family(run.cfg.data.family).task
        self.select, self.maximize, self.reported = self.task.select, self.task.maximize, self.task.reported
        self.default_batch_size, self.default_seed = self.cfg.train.batch_size, self.cfg.train.seed

    def attention_modules(self, model: nn.Module) -> list[nn.Module]:
        from primal_attention.models.transformer import TransformerBlock

        return [m.attn for m in model.modules() if isinstance(m, TransformerBlock)]

    def is_primal(self, module: nn.Module) -> bool:
        from primal_attention.layers.window import WindowPrimalAttention

        return isinstance(module, (PrimalAttention, WindowPrimalAttention))

    def is_softmax(self, module: nn.Module) -> bool:
        from primal_attention.layers.softmax import SoftmaxAttention

        return isinstance(module, SoftmaxAttention)

    def converted_config(self, layers: list[int], options: dict[str, Any]):
        """The run's config with ``layers`` primal: an explicit ``model.attention`` list, and the primal
        options on top of the run's own ``attention_options.primal``. ``window`` among the options makes
        them ``window_primal`` layers (:class:`~primal_attention.WindowPrimalAttention`)."""
        import dataclasses

        from primal_attention.train.families.base import attention_pattern

        kind = "primal" if options.get("window") is None else "window_primal"
        options = {k: v for k, v in options.items() if kind == "window_primal" or k not in ("window", "gate_init")}
        pattern = attention_pattern(self.cfg)
        for i in layers:
            pattern[i] = kind
        attention_options = {k: dict(v) for k, v in self.cfg.model.attention_options.items()}
        attention_options[kind] = {**attention_options.get("primal", {}), **attention_options.get(kind, {}), **options}
        model = dataclasses.replace(self.cfg.model, attention=pattern, attention_options=attention_options)
        return dataclasses.replace(self.cfg, model=model)

    def convert(self, layers: list[int], options: dict[str, Any]) -> nn.Module:
        from primal_attention.train.data import build_model

        cfg = self.converted_config(layers, options)
        torch.manual_seed(cfg.train.seed)
        try:
            student = build_model(cfg, self.splits.train).to(self.device)
        except (TypeError, ValueError) as err:
            raise ConvertError(f"cannot build the primal layers with options {options}: {err}") from err
        own = student.state_dict()
        kept = {k: v for k, v in self.original.state_dict().items() if k in own and own[k].shape == v.shape}
        old, new = self.attention_modules(self.original), self.attention_modules(student)
        attn_prefix = {id(m): name for name, m in student.named_modules()}
        for i in layers:  # the replaced layers' weights are copied explicitly below, v_proj is dropped
            prefix = attn_prefix[id(new[i])] + "."
            kept = {k: v for k, v in kept.items() if not k.startswith(prefix)}
        student.load_state_dict(kept, strict=False)
        with torch.no_grad():
            for i in layers:  # a window layer takes the values too: its window starts as the softmax layer
                for name in ("q_proj", "k_proj", "out_proj") + (("v_proj",) if hasattr(new[i], "v_proj") else ()):
                    src, dst = getattr(old[i], name), getattr(new[i], name)
                    dst.weight.copy_(src.weight)
                    if dst.bias is not None:
                        dst.bias.copy_(src.bias if src.bias is not None else torch.zeros_like(dst.bias))
        return student

    def batch(self, step: int, batch_size: int, seed: int) -> Any:
        from primal_attention.train.data import train_batch

        index = _batch_index(step, len(self.splits.train), batch_size, seed)
        return train_batch(self.cfg, self.splits.train, index, step).to(self.device)

    def forward(self, model: nn.Module, batch: Any) -> Any:
        return model(**batch.inputs)

    def task_loss(self, output: Any, batch: Any) -> Tensor:
        return self.task.loss(output, batch)

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float] | None:
        data = getattr(self.splits, split)
        if data is None:
            return None
        return self.task.evaluate(model, data, self.cfg.train.eval_batch_size, self.device)

    def eval_batches(self, split: str, limit: int) -> list[Any]:
        data = getattr(self.splits, split) or self.splits.train
        size, bs = min(limit, len(data)), self.cfg.train.eval_batch_size
        return [data.batch(torch.arange(s, min(s + bs, size))).to(self.device) for s in range(0, size, bs)]

    def checkpoint_config(self, layers: list[int], options: dict[str, Any]) -> dict[str, Any] | None:
        from primal_attention.train.config import config_to_dict

        return config_to_dict(self.converted_config(layers, options))

    def save(self, model: nn.Module, out: Path, layers: list[int], options: dict[str, Any]) -> None:
        from primal_attention.train.config import dump_config

        dump_config(self.converted_config(layers, options), out / "config.yaml")
        tokenizer = self.run.checkpoint.parent.parent / "tokenizer.json"
        if tokenizer.is_file():
            shutil.copyfile(tokenizer, out / "tokenizer.json")

    def describe(self) -> dict[str, Any]:
        return {"kind": "run", "source": str(Path(self.run.source).resolve()), "config": self.cfg.name,
                "checkpoint": str(Path(self.run.checkpoint).resolve()), "weights": self.run.weights}


class HFSubject(Subject):
    """A Hugging Face causal LM (GPT-2, Llama, Qwen2 families) with token blocks to train and evaluate on.

    train_ids: (M, N) int64 blocks of the model's own kind of data; val_ids: (M', N) held out (None:
    the last tenth of train_ids). The loss is the next-token cross-entropy of HF's ``labels``.
    """

    def __init__(self, model: nn.Module, train_ids: Tensor, val_ids: Tensor | None = None,
                 source: str = "model object") -> None:
        from transformers import PreTrainedModel

        from primal_attention.hf.architectures import architecture_of

        if not isinstance(model, PreTrainedModel):
            raise ConvertError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
        try:
            self.architecture = architecture_of(model.config)
        except ValueError as err:
            raise ConvertError(str(err).removeprefix("primalize: ")) from None
        modules = self.attention_modules(model)
        if not modules:
            raise ConvertError(f"{type(model).__name__} has no self-attention layers that primalize knows")
        first = next(m for m in modules)
        causal = self.is_primal(first) and first.primal.causal or (
            not self.is_primal(first) and self.architecture.settings(model.config, first, 0).causal)
        if not causal or not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
            raise ConvertError(f"{type(model).__name__} ({model.config.model_type}) is not a causal language model; "
                               "convert --hf trains on next-token prediction and needs a decoder with an LM head "
                               "(e.g. GPT2LMHeadModel, LlamaForCausalLM)")
        for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
            if ids is not None and (not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype != torch.int64):
                raise ConvertError(f"{name}: expected int64 token blocks (M, N), got "
                                   f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
        if val_ids is None:
            cut = max(1, len(train_ids) // 10)
            if len(train_ids) < 2:
                raise ConvertError(f"need at least 2 token blocks (train and val), got {len(train_ids)}")
            train_ids, val_ids = train_ids[:-cut], train_ids[-cut:]
        self.device = next(model.parameters()).device
        self.original = model.eval().requires_grad_(False)
        self.train_ids, self.val_ids = train_ids, val_ids
        self.source = str(Path(source).resolve()) if Path(source).exists() else source
        self.reported = ("loss", "ppl")

    def attention_modules(self, model: nn.Module) -> list[nn.Module]:
        from primal_attention.hf.attention import PrimalSelfAttention

        return [m for m in model.modules() if isinstance(m, PrimalSelfAttention) or self.architecture.is_self_attention(m)]

    def is_primal(self, module: nn.Module) -> bool:
        from primal_attention.hf.attention import PrimalSelfAttention

        return isinstance(module, PrimalSelfAttention)

    def is_softmax(self, module: nn.Module) -> bool:
        return self.architecture.is_self_attention(module)

    def convert(self, layers: list[int], options: dict[str, Any]) -> nn.Module:
        from primal_attention.hf import primalize

        student = copy.deepcopy(self.original)
        torch.manual_seed(0)
        try:
            primalize(student, layers=layers, init="from_softmax", **options)
        except (TypeError, ValueError) as err:
            raise ConvertError(str(err).removeprefix("primalize: ")) from err
        return student.requires_grad_(True)

    def batch(self, step: int, batch_size: int, seed: int) -> Any:
        return self.train_ids[_batch_index(step, len(self.train_ids), batch_size, seed)].to(self.device)

    def forward(self, model: nn.Module, batch: Any) -> Any:
        return model(input_ids=batch, use_cache=False).logits

    def task_loss(self, output: Any, batch: Any) -> Tensor:
        logits = output[:, :-1].float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 16) -> dict[str, float] | None:
        if split != "val":
            return None
        was = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            for s in range(0, len(self.val_ids), batch_size):
                ids = self.val_ids[s : s + batch_size].to(self.device)
                logits = self.forward(model, ids)[:, :-1].float()
                total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                         reduction="sum").item()
                count += ids[:, 1:].numel()
        finally:
            model.train(was)
        loss = total / max(count, 1)
        return {"loss": loss, "ppl": math.exp(min(loss, 700.0))}

    def eval_batches(self, split: str, limit: int) -> list[Any]:
        ids = self.val_ids[:limit].to(self.device)
        return [ids[s : s + 16] for s in range(0, len(ids), 16)]

    def save(self, model: nn.Module, out: Path, layers: list[int], options: dict[str, Any]) -> None:
        model.save_pretrained(out / "model")

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf", "source": self.source, "class": type(self.original).__name__,
                "model_type": self.original.config.model_type, "train_blocks": len(self.train_ids),
                "val_blocks": len(self.val_ids), "block_len": int(self.train_ids.shape[1])}
