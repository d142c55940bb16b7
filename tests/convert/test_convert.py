"""primal convert on tiny trained models: our CausalLM and classifier runs, a tiny HF GPT-2; attention
transfer, fine-tuning, resume, constant-state decoding of the converted model, and one-line errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from primal_attention import PrimalAttention
from primal_attention.cli import main
from primal_attention.convert import ConvertError, ConvertOptions, convert_hf, convert_run, resolve_layers
from primal_attention.train.load import load_config
from primal_attention.train.run import load_lm_run, load_run
from primal_attention.train.tasks import LANGUAGE_MODEL, evaluate
from primal_attention.train.trainer import run_seeds

ROOT = Path(__file__).resolve().parents[2]
WORDS = "the and of to in that shall unto lord thou thy king love night death heaven earth sea fire".split()
LM_TINY = ["data.name=text_files", "data.seq_len=16", "data.options.vocab_size=300", "model.layers=2", "model.dim=32",
           "model.num_heads=2", "model.ffn_dim=64", "model.dropout=0", "model.attention_options.primal.rank=4",
           "train.steps=40", "train.eval_every=20", "train.batch_size=8", "optim.warmup_steps=5", "optim.lr=0.003",
           "train.progress=false", "train.threads=1"]
#: quick options for the tests: tiny rank, no progress bar, frequent checkpoints and evaluations.
QUICK = dict(primal={"rank": 4}, progress=False, eval_every=5, checkpoint_every=5, error_examples=32)


def _text(seed: int, lines: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))).capitalize() + "."
                     for _ in range(lines))


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    """A tiny all-softmax CausalLM (configs/lm/corpora_transformer.yaml, 2 layers, D 32), trained 40 steps."""
    root = tmp_path_factory.mktemp("lm")
    text = root / "text"
    text.mkdir()
    for name, seed, lines in (("train.txt", 0, 600), ("valid.txt", 1, 60), ("test.txt", 2, 60)):
        (text / name).write_text(_text(seed, lines))
    mp = pytest.MonkeyPatch()
    mp.setenv("PRIMAL_ATTENTION_CACHE", str(root / "cache"))
    cfg = load_config(ROOT / "configs" / "lm" / "corpora_transformer.yaml", [*LM_TINY, f"data.data_dir={text}"])
    run_seeds(cfg, root / "run", [0])
    yield root / "run" / "seed_0"
    mp.undo()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "primal_attention.cli", *args], capture_output=True, text=True, timeout=300)


def test_resolve_layers() -> None:
    assert resolve_layers("all", 3) == [0, 1, 2]
    assert resolve_layers("last", 3) == [2]
    assert resolve_layers("0,-1", 3) == [0, 2]
    with pytest.raises(ConvertError, match="out of range"):
        resolve_layers([3], 3)
    with pytest.raises(ConvertError, match="twice"):
        resolve_layers([0, -3], 3)


def test_cli_converts_an_lm_run_end_to_end(lm_run, tmp_path) -> None:
    out = tmp_path / "conv"
    proc = _cli("convert", str(lm_run), "--layers", "all", "--transfer-steps", "10", "--finetune-steps", "10",
                "--eta", "0.1", "--out", str(out), "--set", "primal.rank=4", "--set", "eval_every=5", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "original" in proc.stdout and "fine-tuned (10 steps" in proc.stdout
    assert "final weights: best of fine-tuning (step" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["finished"] and report["primal_layers"] == [0, 1]
    assert report["done"] == {"transfer": 10, "finetune": 10}
    for stage in ("transfer", "finetune"):
        entry = report[stage]
        assert entry["steps"] == 10 and entry["cpu_s"] > 0 and entry["losses"]
    assert report["finetune"]["losses"][-1]["ksvd"] > 0  # η·KSVD joined the loss
    for key in ("original", "swap", "transfer", "final"):
        assert set(report[key]["test"]) >= {"loss", "ppl", "bpb"}
    # The output folder is a run: load_run rebuilds the converted model (all primal) with the selected weights.
    run = load_run(out)
    assert run.cfg.model.attention == ["primal", "primal"]
    assert run.weights == "best"
    assert all(isinstance(b.attn, PrimalAttention) and b.attn.causal for b in run.model.decoder.blocks)
    test = evaluate(run.model, run.splits.test, 32, run.device, LANGUAGE_MODEL)
    assert test["loss"] == pytest.approx(report["final"]["test"]["loss"], rel=1e-6)


def test_swap_copies_projections_and_keeps_the_rest(lm_run) -> None:
    from primal_attention.convert import RunSubject

    subject = RunSubject(lm_run)
    student = subject.convert([1], {"rank": 4})
    old, new = subject.original.decoder.blocks, student.decoder.blocks
    assert isinstance(new[1].attn, PrimalAttention) and not isinstance(new[0].attn, PrimalAttention)
    for name in ("q_proj", "k_proj", "out_proj"):
        assert torch.equal(getattr(old[1].attn, name).weight, getattr(new[1].attn, name).weight)
    assert torch.equal(old[0].attn.v_proj.weight, new[0].attn.v_proj.weight)
    assert torch.equal(old[1].ffn.fc1.weight, new[1].ffn.fc1.weight)
    assert torch.equal(subject.original.embed.weight, student.embed.weight)


@pytest.mark.parametrize("mode", ["all", "layer"])
def test_transfer_reduces_the_layer_output_error(lm_run, tmp_path, mode) -> None:
    report = convert_run(lm_run, tmp_path / mode, ConvertOptions(layers="all", transfer_steps=30, transfer_mode=mode,
                                                                  **QUICK))
    assert report["transfer"]["steps"] == 30 * (2 if mode == "layer" else 1)
    for kind in ("isolated", "in_model"):
        before, after = report["swap"]["layer_error"][kind], report["transfer"]["layer_error"][kind]
        for layer in ("0", "1"):
            assert after[layer] < 0.8 * before[layer], (kind, layer, before, after)
    assert report["transfer"]["val"]["loss"] < report["swap"]["val"]["loss"]


def test_converted_all_primal_lm_decodes_with_constant_state(lm_run, tmp_path) -> None:
    out = tmp_path / "conv"
    convert_run(lm_run, out, ConvertOptions(layers="all", transfer_steps=5, **QUICK))
    model = load_lm_run(out).model.double()
    tokens = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    full = model(tokens)
    state, sizes = None, set()
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-9)
        sizes.add(state.nbytes())
    assert len(sizes) == 1  # the decoding state does not grow with the context


def test_a_window_conversion_starts_as_the_original_when_the_window_covers_the_input(lm_run, tmp_path) -> None:
    from primal_attention import WindowPrimalAttention
    from primal_attention.convert import RunSubject

    subject = RunSubject(lm_run)
    student = subject.convert([0, 1], {"rank": 4, "window": 16, "gate_init": 60.0})
    assert all(isinstance(b.attn, WindowPrimalAttention) for b in student.decoder.blocks)
    tokens = torch.randint(0, subject.original.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the gate open and N <= w: the window is the softmax layer it replaced
        torch.testing.assert_close(student.eval()(tokens), subject.original(tokens), rtol=0, atol=1e-4)

    out = tmp_path / "window"
    proc = _cli("convert", str(lm_run), "--layers", "all", "--window", "4", "--transfer-steps", "5", "--out", str(out),
                "--set", "primal.rank=4", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    run = load_lm_run(out)
    assert run.cfg.model.attention == ["window_primal", "window_primal"]
    model = run.model.double()
    full = model(tokens)
    state = None
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-9)
    bad = _cli("convert", str(lm_run), "--window", "4", "--set", "primal.window=8", "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0 and "disagree" in bad.stderr and "Traceback" not in bad.stderr
    for value, message in (("0", "window must be a positive int, got 0"), ("abc", "invalid int value: 'abc'")):
        bad = _cli("convert", str(lm_run), "--window", value, "--out", str(tmp_path / f"bad_{value}"), "--no-progress")
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr
        assert not (tmp_path / f"bad_{value}").exists()  # nothing written for a conversion that cannot start


def test_resume_continues_the_interrupted_conversion(lm_run, tmp_path) -> None:
    straight = convert_run(lm_run, tmp_path / "a", ConvertOptions(layers="all", transfer_steps=8, **QUICK))
    first = convert_run(lm_run, tmp_path / "b", ConvertOptions(layers="all", transfer_steps=4, **QUICK))
    assert first["done"] == {"transfer": 4, "finetune": 0}
    second = convert_run(lm_run, tmp_path / "b", ConvertOptions(layers="all", transfer_steps=8, **QUICK))
    assert second["done"] == {"transfer": 8, "finetune": 0}
    assert [r["step"] for r in second["transfer"]["losses"]] == [r["step"] for r in straight["transfer"]["losses"]]

    def weights(folder: Path) -> dict:
        return load_file(str(folder / "checkpoints" / (folder / "checkpoints" / "latest").read_text().strip()
                             / "model.safetensors"))

    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same trajectory as the uninterrupted run
    third = convert_run(lm_run, tmp_path / "b", ConvertOptions(layers="all", transfer_steps=8, finetune_steps=5, **QUICK))
    assert third["done"] == {"transfer": 8, "finetune": 5} and third["finetune"]["steps"] == 5
    again = convert_run(lm_run, tmp_path / "b", ConvertOptions(layers="all", transfer_steps=8, finetune_steps=5, **QUICK))
    assert again["final"] == third["final"]  # a finished conversion is not run again
    with pytest.raises(ConvertError, match="transfer cannot be extended"):
        convert_run(lm_run, tmp_path / "b", ConvertOptions(layers="all", transfer_steps=9, finetune_steps=5, **QUICK))
    with pytest.raises(ConvertError, match="different conversion"):
        convert_run(lm_run, tmp_path / "b", ConvertOptions(layers="last", transfer_steps=8, **QUICK))


def test_classifier_run_converts_on_the_non_causal_path(tmp_path) -> None:
    tiny = ["data.max_examples=60", "model.dim=16", "model.num_heads=2", "model.ffn_dim=32", "train.batch_size=8",
            "train.eval_batch_size=128", "train.progress=false", "train.threads=1", "train.epochs=2",
            "train.protocol=holdout"]
    cfg = load_config(ROOT / "configs" / "uea" / "JapaneseVowels_transformer.yaml", tiny)
    run_seeds(cfg, tmp_path / "run", [0])
    report = convert_run(tmp_path / "run" / "seed_0", tmp_path / "conv",
                         ConvertOptions(layers="last", transfer_steps=10, finetune_steps=6, finetune="primal",
                                        primal={"rank": 4}, progress=False, eval_every=3))
    assert set(report["final"]["test"]) >= {"acc", "loss"} and report["final"]["val"] is not None
    converted, original = load_run(tmp_path / "conv").model, load_run(tmp_path / "run" / "seed_0").model
    layers = [m for m in converted.modules() if isinstance(m, PrimalAttention)]
    assert len(layers) == 1 and not layers[0].causal
    # finetune="primal": only the new layer and the norms trained; feed-forward weights are the original's.
    new, old = converted.encoder.blocks, original.encoder.blocks
    assert torch.equal(new[1].ffn.fc1.weight, old[1].ffn.fc1.weight) and torch.equal(new[0].attn.v_proj.weight,
                                                                                     old[0].attn.v_proj.weight)
    assert not torch.equal(new[1].norm1.weight, old[1].norm1.weight)
    assert not torch.equal(new[1].attn.q_proj.weight, old[1].attn.q_proj.weight)
    assert report["transfer"]["layer_error"]["isolated"]["1"] < report["swap"]["layer_error"]["isolated"]["1"]


def _tiny_gpt2(folder: Path) -> torch.Tensor:
    """A 2-layer GPT-2 from a config, trained 60 steps on arithmetic sequences mod 48; saved to folder."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    vocab = 48
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=64,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=0))
    start, stride = torch.randint(0, vocab, (256, 1)), torch.randint(1, 4, (256, 1))
    ids = (start + stride * torch.arange(24)) % vocab
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        b = ids[torch.randint(0, 224, (16,))]
        loss = model(input_ids=b, labels=b).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(folder)
    return ids


def test_hf_gpt2_converts_generates_and_round_trips(tmp_path, capsys) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2LMHeadModel

    from primal_attention import hf

    ids = _tiny_gpt2(tmp_path / "gpt2")
    torch.save({"train": ids[:224], "val": ids[224:]}, tmp_path / "ids.pt")
    out = tmp_path / "conv"
    assert main(["convert", "--hf", str(tmp_path / "gpt2"), "--hf-class", "GPT2LMHeadModel", "--hf-data",
                 str(tmp_path / "ids.pt"), "--layers", "all", "--transfer-steps", "15", "--finetune-steps", "6",
                 "--set", "primal.rank=8", "--set", "eval_every=3", "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    for layer in ("0", "1"):
        assert report["transfer"]["layer_error"]["isolated"][layer] < report["swap"]["layer_error"]["isolated"][layer]
    model = hf.from_pretrained(GPT2LMHeadModel, out / "model")
    assert len([m for m in model.modules() if isinstance(m, hf.PrimalSelfAttention)]) == 2
    with torch.no_grad():
        val = ids[224:]
        loss = model(input_ids=val, labels=val).loss.item()
    assert loss == pytest.approx(report["final"]["val"]["loss"], rel=1e-5)
    prompt = ids[224:226, :6]
    cached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=True)
    uncached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
    # The converted folder is itself an HF model with no softmax layer left to convert.
    assert main(["convert", "--hf", str(out / "model"), "--hf-class", "GPT2LMHeadModel", "--hf-data",
                 str(tmp_path / "ids.pt"), "--out", str(tmp_path / "again"), "--no-progress"]) == 2
    assert "no softmax attention layers to convert (its layers: primal)" in capsys.readouterr().err


def test_hf_api_refuses_an_encoder(tmp_path) -> None:
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                                       vocab_size=30))
    with pytest.raises(ConvertError, match="not a causal language model"):
        convert_hf(model, torch.zeros(4, 8, dtype=torch.int64), tmp_path / "x", ConvertOptions())


def test_bad_input_gives_one_line_errors(lm_run, tmp_path, capsys) -> None:
    def error(*args: str) -> str:
        assert main(["convert", *args, "--no-progress"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("primal convert: error: ")
        return lines[0]

    out = str(tmp_path / "out")
    assert "not a trained run" in error(str(tmp_path), "--out", out)
    assert "holds the runs seed_0" in error(str(lm_run.parent), "--out", out)
    assert "is a config" in error(str(ROOT / "configs" / "lm" / "corpora_transformer.yaml"), "--out", out)
    assert "out of range" in error(str(lm_run), "--layers", "7", "--out", out)
    assert "unknown option" in error(str(lm_run), "--set", "nope=1", "--out", out)
    assert "give a run directory or --hf" in error("--out", out)
    assert "no config.json" in error("--hf", str(tmp_path), "--hf-data", "x.pt", "--out", out)
    conv = tmp_path / "conv"
    convert_run(lm_run, conv, ConvertOptions(layers="all", **QUICK))
    assert "no softmax attention layers" in error(str(conv), "--out", out)
    last = tmp_path / "last"
    convert_run(lm_run, last, ConvertOptions(layers="last", **QUICK))
    assert "layer 1 is already primal; choose among the softmax layers [0]" in error(str(last), "--layers", "1", "--out", out)
    assert "different conversion" in error(str(lm_run), "--layers", "last", "--out", str(conv))
    assert "is the run being converted" in error(str(lm_run), "--out", str(lm_run))


def test_hf_text_data_is_tokenised_with_the_folders_tokenizer(tmp_path, capsys) -> None:
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder = tmp_path / "gpt2"
    vocab = {w: i for i, w in enumerate(["[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(vocab), n_positions=32)).save_pretrained(folder)
    (tmp_path / "corpus.txt").write_text(_text(0, 80))
    assert main(["convert", "--hf", str(folder), "--hf-data", str(tmp_path / "corpus.txt"), "--hf-seq-len", "16",
                 "--layers", "last", "--transfer-steps", "3", "--set", "primal.rank=4", "--out", str(tmp_path / "conv"),
                 "--no-progress"]) == 0
    report = json.loads((tmp_path / "conv" / "report.json").read_text())
    assert report["settings"]["source"]["block_len"] == 16 and report["primal_layers"] == [1]
    (tmp_path / "short.txt").write_text("the lord")
    assert main(["convert", "--hf", str(folder), "--hf-data", str(tmp_path / "short.txt"), "--out",
                 str(tmp_path / "x"), "--no-progress"]) == 2
    assert "fewer than two blocks" in capsys.readouterr().err


def test_ctrl_c_keeps_the_last_checkpoint_and_a_rerun_finishes_identically(lm_run, tmp_path, monkeypatch) -> None:
    from primal_attention.convert import Interrupted, pipeline

    options = dict(layers="all", transfer_steps=8, **QUICK)
    straight = convert_run(lm_run, tmp_path / "a", ConvertOptions(**options))
    real, calls = pipeline.all_at_once_loss, []

    def interrupting(*args, **kwargs):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "all_at_once_loss", interrupting)
    with pytest.raises(Interrupted, match="interrupted in transfer at step 6; .* checkpoint ckpt-00000005"):
        convert_run(lm_run, tmp_path / "b", ConvertOptions(**options))
    monkeypatch.setattr(pipeline, "all_at_once_loss", real)
    resumed = convert_run(lm_run, tmp_path / "b", ConvertOptions(**options))  # continues from the step-5 checkpoint
    assert resumed["transfer"]["layer_error"] == straight["transfer"]["layer_error"]
    assert resumed["final"] == straight["final"]


def test_hf_llama_with_rope_and_grouped_keys_converts_layer_by_layer(tmp_path) -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                         intermediate_size=64, vocab_size=40, max_position_embeddings=64))
    blocks = torch.randint(0, 40, (48, 16), generator=torch.Generator().manual_seed(1))
    report = convert_hf(model, blocks, tmp_path / "conv", ConvertOptions(
        layers="all", transfer_steps=15, transfer_mode="layer", transfer_lr=3e-3, **QUICK))
    for layer in ("0", "1"):
        assert report["transfer"]["layer_error"]["in_model"][layer] < report["swap"]["layer_error"]["in_model"][layer]
    assert report["final"]["val"]["ppl"] > 1 and report["final"]["test"] is None  # HF data has no test split


def test_rerunning_a_finished_hf_conversion_keeps_the_selected_weights(tmp_path) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2LMHeadModel

    from primal_attention import hf

    ids = _tiny_gpt2(tmp_path / "gpt2")
    options = dict(layers="last", transfer_steps=3, finetune_steps=6, **{**QUICK, "eval_every": 2})
    model = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")
    first = convert_hf(model, ids[:224], tmp_path / "conv", ConvertOptions(**options), val_ids=ids[224:])
    saved = (tmp_path / "conv" / "model" / "model.safetensors").read_bytes()
    again = convert_hf(model, ids[:224], tmp_path / "conv", ConvertOptions(**options), val_ids=ids[224:])
    assert again["final"] == first["final"]
    assert (tmp_path / "conv" / "model" / "model.safetensors").read_bytes() == saved
    loaded = hf.from_pretrained(GPT2LMHeadModel, tmp_path / "conv" / "model")
    with torch.no_grad():
        loss = loaded(input_ids=ids[224:], labels=ids[224:]).loss.item()
    assert loss == pytest.approx(first["final"]["val"]["loss"], rel=1e-5)


def test_vision_transformer_run_converts(tmp_path) -> None:
    sets = ["data.name=digits", "model.patch_size=2", "model.dim=32", "model.ffn_dim=64", "model.layers=2",
            "train.batch_size=32", "train.epochs=1", "data.options.crop_padding=0", "data.options.flip=false",
            "train.progress=false", "train.threads=1", "model.attention_options.primal.rank=4"]
    run_seeds(load_config(ROOT / "configs" / "vision" / "fmnist_vit.yaml", sets), tmp_path / "run", [0])
    report = convert_run(tmp_path / "run" / "seed_0", tmp_path / "conv",
                         ConvertOptions(layers="all", transfer_steps=6, finetune_steps=2, **QUICK))
    assert report["transfer"]["layer_error"]["isolated"]["0"] < report["swap"]["layer_error"]["isolated"]["0"]
    layers = [m for m in load_run(tmp_path / "conv").model.modules() if isinstance(m, PrimalAttention)]
    assert len(layers) == 2 and not layers[0].causal


def test_overwrite_never_removes_a_training_run_and_one_writer_per_out(lm_run, tmp_path) -> None:
    before = sorted(p.relative_to(lm_run.parent) for p in lm_run.parent.rglob("*"))
    for out in (lm_run, lm_run.parent):  # the run itself, and the folder that holds it
        proc = _cli("convert", str(lm_run), "--layers", "last", "--transfer-steps", "2", "--finetune-steps", "0",
                    "--out", str(out), "--overwrite", "--no-progress")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "is the run being converted" in proc.stderr or "not a conversion" in proc.stderr
    assert sorted(p.relative_to(lm_run.parent) for p in lm_run.parent.rglob("*")) == before  # untouched
    import fcntl
    import os

    out = tmp_path / "conv"
    out.mkdir()
    with open(tmp_path / ".conv.lock", "w") as held:  # another convert writing into the same --out
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"{os.getpid()}\n")
        held.flush()
        proc = _cli("convert", str(lm_run), "--layers", "last", "--transfer-steps", "2", "--finetune-steps", "0",
                    "--out", str(out), "--no-progress")
    assert proc.returncode == 2 and "in use by another primal convert" in proc.stderr
