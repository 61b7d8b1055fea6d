#!/usr/bin/env python3
"""Builds the tiny local model that real vLLM serves in Headroom's integration tests.

Run it with the vLLM venv's python (it needs torch, transformers, tokenizers):

    "$VENV/bin/python" scripts/vllm/make-tiny-model.py [--variant small|big]
        [--out DIR] [--seed N] [--tokenizer-out PATH] [--force]

Output (default ${HEADROOM_CACHE:-~/.cache/headroom}/tiny-llama, or tiny-llama-big):
a random-weight Llama with a byte-level BPE tokenizer trained here on local text.
Nothing comes from a model hub. `small` is hidden 128, 2 layers; `big` is hidden 192,
3 layers (about 3x the prefill and 2x the decode time on one CPU core), with the very
same tokenizer, so the two can serve one model name as a heterogeneous fleet.

Invariants:
- Deterministic for a given seed and corpus: the corpus is read in sorted path order
  and capped, the BPE trainer is deterministic, weights come from a seeded generator.
- The directory is valid only when `headroom-model.json` exists and names this
  RECIPE; it is written last, so an interrupted run is rebuilt next time.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Bump when anything below changes what gets written.
RECIPES = {"small": "tiny-llama/v2", "big": "tiny-llama-big/v1"}
# Llama shapes per variant; the head size stays 32 so the attention kernels match.
SHAPES = {
    "small": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
    "big": dict(hidden_size=192, intermediate_size=384, num_hidden_layers=3,
                num_attention_heads=6, num_key_value_heads=2),
}
MANIFEST = "headroom-model.json"
VOCAB_SIZE = 4096
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CORPUS_ROOTS = ["/usr/share/common-licenses", "/usr/share/doc"]
CORPUS_CAP_BYTES = 24 * 1024 * 1024  # enough for 4096 merges, keeps training ~10 s
FILE_CAP_BYTES = 1024 * 1024
# Minimal template so /v1/chat/completions works; roles and turns are delimited by
# the BOS/EOS specials.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
REQUIRED_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
]


def log(msg: str) -> None:
    print(f"[tiny-model {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def default_out(variant: str) -> Path:
    cache = os.environ.get("HEADROOM_CACHE") or os.path.expanduser("~/.cache/headroom")
    return Path(cache) / ("tiny-llama" if variant == "small" else "tiny-llama-big")


def is_valid(out: Path, variant: str) -> bool:
    """True when a previous run completed with this variant's recipe."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe") != RECIPES[variant]:
        return False
    return all((out / name).is_file() and (out / name).stat().st_size > 0 for name in REQUIRED_FILES)


def read_text_file(path: Path) -> str | None:
    """Returns the file's text, or None for binaries and unreadable files."""
    try:
        if path.stat().st_size > FILE_CAP_BYTES:
            return None
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)[:FILE_CAP_BYTES]
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\x00" in raw:
        return None
    return raw.decode("utf-8", errors="replace")


def corpus_files() -> list[Path]:
    files: list[Path] = []
    for root in CORPUS_ROOTS:
        base = Path(root)
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if p.is_file() and not p.is_symlink():
                    files.append(p)
    return files


def build_corpus() -> tuple[list[str], str, int]:
    """Returns (texts, sha256 of the corpus, byte count), read in a fixed order."""
    texts: list[str] = []
    digest = hashlib.sha256()
    total = 0
    for path in corpus_files():
        text = read_text_file(path)
        if not text:
            continue
        size = len(text.encode("utf-8"))
        if total + size > CORPUS_CAP_BYTES:
            break
        texts.append(text)
        digest.update(text.encode("utf-8"))
        total += size
    if total < 200_000:
        raise SystemExit(
            f"only {total} bytes of local text under {CORPUS_ROOTS}; need at least 200 kB "
            "to train a 4096-token vocabulary"
        )
    return texts, digest.hexdigest(), total


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos = tok.token_to_id("<s>")
    # Llama-style: a plain prompt gets BOS; chat prompts carry it via the template.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"trained vocabulary has {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}")
    return tok


def build(out: Path, seed: int, variant: str) -> dict:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    t0 = time.monotonic()
    texts, corpus_sha, corpus_bytes = build_corpus()
    log(f"corpus: {len(texts)} files, {corpus_bytes} bytes, sha256 {corpus_sha[:16]}")
    tok = train_tokenizer(texts)
    log(f"tokenizer trained in {time.monotonic() - t0:.1f} s")

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE

    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    config = LlamaConfig(
        **SHAPES[variant],
        head_dim=32,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    # Initialised in float32 (seeded), stored as bfloat16: the dtype vLLM's CPU
    # backend runs anyway, so it loads without a cast.
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.eval()
    gen = GenerationConfig(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"])

    # Write into a sibling temp dir, then swap in, so `out` is never half-written.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        gen.save_pretrained(tmp)
        fast.save_pretrained(tmp)
        # Some transformers versions keep the template only in chat_template.jinja;
        # write it into tokenizer_config.json too so every loader finds it.
        cfg_path = tmp / "tokenizer_config.json"
        tcfg = json.loads(cfg_path.read_text())
        tcfg["chat_template"] = CHAT_TEMPLATE
        cfg_path.write_text(json.dumps(tcfg, indent=2, sort_keys=True) + "\n")
        if not (tmp / "special_tokens_map.json").exists():
            smap = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
            (tmp / "special_tokens_map.json").write_text(json.dumps(smap, indent=2) + "\n")
        manifest = {
            "recipe": RECIPES[variant],
            "variant": variant,
            "seed": seed,
            "corpus_sha256": corpus_sha,
            "corpus_bytes": corpus_bytes,
            "tokenizer_sha256": hashlib.sha256((tmp / "tokenizer.json").read_bytes()).hexdigest(),
            "weights_sha256": hashlib.sha256((tmp / "model.safetensors").read_bytes()).hexdigest(),
            "parameters": sum(p.numel() for p in model.parameters()),
            "special_token_ids": ids,
        }
        missing = [n for n in REQUIRED_FILES if not (tmp / n).is_file()]
        if missing:
            raise SystemExit(f"save_pretrained did not write {missing}")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        # mkdtemp makes 0700; the model is read by other users' servers too.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"model written to {out} in {time.monotonic() - t0:.1f} s")
    return manifest


def self_check(out: Path, variant: str) -> None:
    """Loads what was written the way vLLM will and fails loudly if it is unusable."""
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    text = "The quick brown fox jumps over the lazy dog."
    ids = tok(text)["input_ids"]
    if ids[0] != tok.bos_token_id or tok.decode(ids, skip_special_tokens=True) != text:
        raise SystemExit(f"tokenizer round trip failed: {ids}")
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    if not chat.endswith("<s>assistant\n"):
        raise SystemExit(f"chat template gave {chat!r}")
    if cfg.vocab_size != len(tok) or cfg.num_hidden_layers != SHAPES[variant]["num_hidden_layers"]:
        raise SystemExit(f"config mismatch: vocab {cfg.vocab_size} vs tokenizer {len(tok)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=sorted(SHAPES), default="small")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-out", type=Path, help="also copy tokenizer.json here")
    ap.add_argument("--force", action="store_true", help="rebuild even if valid")
    args = ap.parse_args()
    out: Path = (args.out or default_out(args.variant)).expanduser().resolve()

    if not args.force and is_valid(out, args.variant):
        log(f"reusing {out}")
    else:
        build(out, args.seed, args.variant)
        self_check(out, args.variant)
    if args.tokenizer_out:
        args.tokenizer_out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "tokenizer.json", args.tokenizer_out)
        log(f"tokenizer.json copied to {args.tokenizer_out}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
