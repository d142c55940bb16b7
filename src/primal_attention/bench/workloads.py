"""What one benchmark call runs: a layer forward+backward, a training step or an inference forward.

Levels (all with mask=None, every token real):

* ``layer``: the attention layer alone on x (B, N, D) with requires_grad; loss = mean(out²), plus
  η·J² of the layer's KSVD objective for primal layers; backward.
* ``train``: the LRA ListOps model (D 64, H 2, 2 pre-norm layers, MLP 128, mean pooling, dropout
  0.1, head MLP 128; primal s 20, n 200, η 0.1) as one training step: forward, cross-entropy +
  η·ksvd_loss, backward, AdamW step (eps 1e-6, as the authors).
* ``infer``: the same model's forward under ``torch.no_grad()``.

dtype "bf16" runs forward and loss under ``torch.autocast(dtype=torch.bfloat16)`` (weights float32,
as in mixed-precision training); mode "compile" wraps the forward + loss (or the model forward for
``infer``) in ``torch.compile``; backward and the optimiser step stay eager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from primal_attention.bench.methods import METHODS
from primal_attention.ksvd.terms import ksvd_terms

LEVELS = ("layer", "train", "infer")
DTYPES = ("fp32", "bf16")
MODES = ("eager", "compile")

#: ListOps (docs/method.md §5): vocabulary of the brackets tokenisation, 10 classes.
VOCAB_SIZE = 16
NUM_CLASSES = 10
ETA = 0.1


@dataclass(frozen=True)
class Case:
    """One configuration of the grid."""

    level: str
    method: str
    seq_len: int
    batch: int
    dtype: str = "fp32"
    mode: str = "eager"
    device: str = "cpu"
    dim: int = 64
    heads: int = 2

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def key(self) -> tuple[str, str, str, str]:
        """The curve this case belongs to (one line per method in a plot)."""
        return (self.level, self.dtype, self.mode, self.method)


def listops_config(attention: str, options: dict, seq_len: int, dim: int = 64, heads: int = 2):
    """The LRA ListOps classifier config with ``attention`` in both layers."""
    from primal_attention.models.classifier import ClassifierConfig

    return ClassifierConfig(
        num_classes=NUM_CLASSES,
        max_seq_len=seq_len,
        vocab_size=VOCAB_SIZE,
        dim=dim,
        num_heads=heads,
        ffn_dim=128,
        attention=[attention, attention],
        attention_options={attention: dict(options)} if options else {},
        dropout=0.1,
        norm_first=True,
        pooling="mean",
        head_hidden=128,
    )


def _autocast(case: Case):
    if case.dtype == "bf16":
        return torch.autocast(torch.device(case.device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _build_authors(case: Case, device: torch.device, gen: torch.Generator) -> Callable[[], None]:
    """The authors' code at ``case`` (eager only: their modules are not written for torch.compile)."""
    from primal_attention.bench import authors

    if case.mode != "eager":
        raise ValueError("method authors runs eager only")
    run = authors.build(case.level, seq_len=case.seq_len, batch=case.batch, dim=case.dim, heads=case.heads,
                        vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES, eta=ETA, device=device, gen=gen)

    def call() -> None:
        with _autocast(case):
            run()

    return call


def build(case: Case, seed: int = 0) -> Callable[[], None]:
    """A zero-argument callable that runs ``case`` once (inputs and optimiser state kept inside)."""
    if case.level not in LEVELS or case.dtype not in DTYPES or case.mode not in MODES:
        raise ValueError(f"unknown level / dtype / mode in {case}")
    spec = METHODS[case.method]
    device = torch.device(case.device)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if spec.external:
        return _build_authors(case, device, gen)
    if case.level == "layer":
        from primal_attention.layers import build_attention

        layer = build_attention(spec.attention, case.dim, case.heads, max_seq_len=case.seq_len, **spec.options)
        layer = layer.to(device).train()
        x = torch.randn(case.batch, case.seq_len, case.dim, generator=gen).to(device).requires_grad_(True)
        is_primal = spec.primal
        # one collector for the whole benchmark, opened here (a handle): each step consumes its term
        terms = ksvd_terms(layer) if is_primal else None

        def loss_fn(x: torch.Tensor) -> torch.Tensor:
            with _autocast(case):
                out = layer(x)
                loss = out.float().square().mean()
                if terms is not None:
                    loss = loss + ETA * terms.loss()
            return loss

        fn = torch.compile(loss_fn) if case.mode == "compile" else loss_fn

        def step() -> None:
            x.grad = None
            layer.zero_grad(set_to_none=True)
            fn(x).backward()

        return step

    from primal_attention.models.classifier import SequenceClassifier

    model = SequenceClassifier(listops_config(spec.attention, spec.options, case.seq_len, case.dim, case.heads))
    model = model.to(device)
    tokens = torch.randint(1, VOCAB_SIZE, (case.batch, case.seq_len), generator=gen).to(device)
    if case.level == "infer":
        model.eval()

        def forward(tokens: torch.Tensor) -> torch.Tensor:
            with _autocast(case):
                return model(tokens)

        fwd = torch.compile(forward) if case.mode == "compile" else forward

        def infer() -> None:
            with torch.no_grad():
                fwd(tokens)

        return infer

    model.train()
    labels = torch.randint(0, NUM_CLASSES, (case.batch,), generator=gen).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.0)
    terms = ksvd_terms(model) if spec.primal else None  # a handle for the benchmark's life

    def loss_fn(tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with _autocast(case):
            logits = model(tokens)
            loss = F.cross_entropy(logits.float(), labels)
            if terms is not None:
                loss = loss + ETA * terms.loss()
        return loss

    fn = torch.compile(loss_fn) if case.mode == "compile" else loss_fn

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        fn(tokens, labels).backward()
        opt.step()

    return train_step
