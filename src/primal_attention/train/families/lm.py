"""The ``lm`` family: causal language modelling of a text stream (the public-domain corpora, or train /
valid / test text files such as WikiText-103's) with a :class:`~primal_attention.models.lm.CausalLM`."""

from __future__ import annotations

from dataclasses import dataclass

from pathlib import Path
from typing import Any

from torch import nn

from primal_attention.models.lm import CausalLM, CausalLMConfig
from primal_attention.train.config import ConfigError, DataConfig, ExperimentConfig, LMModelConfig
from primal_attention.train.families.base import Family, Splits, attention_pattern, model_fields, register_family
from primal_attention.train.tasks import LANGUAGE_MODEL

#: data.name of the lm family.
LM_DATASETS = ("corpora", "text_files")
#: data.options of the lm family.
LM_OPTIONS = ("vocab_size", "max_tokens")


def lm_options(cfg: DataConfig) -> dict[str, Any]:
    """``vocab_size`` (default 4096) and ``max_tokens`` (default None) of an lm data section, checked."""
    unknown = sorted(set(cfg.options) - set(LM_OPTIONS))
    if unknown:
        raise ConfigError(f"data.options: unknown for data.family lm: {', '.join(unknown)}; expected {', '.join(LM_OPTIONS)}")
    vocab, cap = cfg.options.get("vocab_size", 4096), cfg.options.get("max_tokens")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 257:
        raise ConfigError(f"data.options.vocab_size must be an integer >= 257 (256 bytes and <|endoftext|>), got {vocab!r}")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 2):
        raise ConfigError(f"data.options.max_tokens must be an integer >= 2 or null, got {cap!r}")
    return {"vocab_size": vocab, "max_tokens": cap}


@dataclass(frozen=True)
class LMStandIn:
    """What a language model is built from, without the text: the tokenizer's vocabulary and the context."""

    vocab_size: int
    block_len: int


@register_family("lm")
class LMFamily(Family):
    model_section = LMModelConfig
    task = LANGUAGE_MODEL
    summary_metrics = ("test_ppl", "test_bpb", "best_test_ppl", "best_val_ppl", "final_test_ppl")
    generates = True

    def check(self, cfg: ExperimentConfig) -> None:
        d = cfg.data
        if not (d.seq_len or 0) > 0:
            raise ConfigError("data.seq_len (the context of the training blocks) must be a positive integer for data.family lm")
        if d.name not in LM_DATASETS:
            raise ConfigError(f"data.name: LM dataset must be one of {', '.join(LM_DATASETS)}, got {d.name!r}")
        if d.name == "text_files" and d.data_dir is None:
            raise ConfigError("data.name=text_files needs data.data_dir (train.txt / valid.txt / test.txt, or wiki.*.tokens)")
        if d.max_examples is not None or d.max_test_examples is not None:
            raise ConfigError("data.max_examples does not apply to data.family lm; cap the streams with data.options.max_tokens")
        lm_options(d)
        if cfg.model.hf is not None:
            self._check_hf(cfg)

    @staticmethod
    def _check_hf(cfg: ExperimentConfig) -> None:
        m = cfg.model
        try:
            from primal_attention.hf.lm import KIND_LAYERS, causal_model_types
        except ImportError:
            raise ConfigError("model.hf needs the hf extra: pip install 'primal-attention[hf]'") from None
        if m.hf.architecture not in causal_model_types():
            raise ConfigError(f"model.hf.architecture must be one of {', '.join(causal_model_types())}, "
                              f"got {m.hf.architecture!r}")
        if m.attention is not None or m.kind not in KIND_LAYERS:
            raise ConfigError("model.hf: the primal layers follow model.kind (primalformer: all, primal+: the last, "
                              "transformer: none); a per-layer model.attention list does not apply")
        unused = sorted(set(m.attention_options) - {"primal"})
        if unused:
            raise ConfigError(f"model.attention_options: only 'primal' applies with model.hf, got {', '.join(unused)}")

    def load(self, cfg: ExperimentConfig) -> Splits:
        """Validation and test are held-out works (or files), not a split of TRAIN; validation is used
        under the holdout protocol."""
        from primal_attention.data import lm

        d = cfg.data
        kw = dict(block_len=d.seq_len, progress=True, **lm_options(d))
        if d.name == "corpora":
            train, val, test = (lm.load_lm(s, **kw) for s in ("train", "val", "test"))
        else:
            train, val, test = (lm.load_lm_files(d.data_dir, s, **kw) for s in ("train", "val", "test"))
        return Splits(train, val if cfg.train.protocol == "holdout" else None, test)

    def build_model(self, cfg: ExperimentConfig, data: Any) -> nn.Module:
        fields = model_fields(cfg.model)
        spec = fields.pop("hf")
        if spec is None:
            return CausalLM(CausalLMConfig(vocab_size=data.vocab_size, max_seq_len=data.block_len,
                                           attention=attention_pattern(cfg), **fields))
        from primal_attention.hf.lm import build_hf_lm

        m = cfg.model
        try:
            return build_hf_lm(spec["architecture"], spec["config"], kind=m.kind, layers=m.layers, dim=m.dim,
                               num_heads=m.num_heads, ffn_dim=m.ffn_dim, vocab_size=data.vocab_size,
                               max_seq_len=data.block_len, primal_options=dict(m.attention_options.get("primal", {})))
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def stand_in(self, cfg: ExperimentConfig) -> LMStandIn:
        return LMStandIn(vocab_size=lm_options(cfg.data)["vocab_size"], block_len=cfg.data.seq_len)

    def fetch(self, name: str, *, data_dir: str | None = None, vocab_size: int = 4096) -> str | None:
        """``lm``: the corpora fetched and split, the BPE of ``vocab_size`` trained (or loaded), and their sizes."""
        if name != "lm":
            return None
        from primal_attention.data.lm import lm_data_info

        info = lm_data_info(vocab_size=vocab_size)
        lines = [f"LM corpora (split rule: {info['rule']})"]
        for split, t in info["splits"].items():
            lines.append(f"  {split:5s} {t['works']:3d} works, {t['bytes'] / 1e6:6.2f} MB, {t['tokens']:9d} tokens "
                         f"(BPE {vocab_size})")
        for corpus, parts in info["corpora"].items():
            for split in ("val", "test"):
                lines.append(f"  {corpus} {split}: {', '.join(parts[split]['works']) or '-'}")
        return "\n".join(lines)

    def prepare_run(self, splits: Splits, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        splits.train.tokenizer.save(out / "tokenizer.json")  # `primal generate` reads it

    def trivial_baselines(self, cfg: ExperimentConfig, splits: Splits) -> dict[str, dict[str, Any]]:
        from primal_attention.train.trivial import lm_baselines

        return lm_baselines(splits)
