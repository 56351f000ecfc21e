"""C4-format data: shards ``c4-train.*.json.gz`` / ``c4-validation.*.json.gz`` (AllenAI/MLPerf
layout: one JSON object per line with a ``"text"`` field), tokenized with HF ``tokenizers``,
EOS appended to every document, packed into fixed-length sequences.

The training stream is deterministic for a seed (shard order shuffled per epoch) and resumable:
``state()`` is a small dict (epoch, shard, document, leftover tokens) saved with every
checkpoint; ``TokenStream(..., state=...)`` continues exactly where it stopped.
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import torch

EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>")


def shards(data_dir, split: str) -> list[Path]:
    d = Path(data_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"data directory {d} does not exist")
    found = sorted(d.glob(f"c4-{split}.*.json.gz"))
    if not found:
        raise FileNotFoundError(f"no c4-{split}.*.json.gz shards in {d}")
    return found


def iter_documents(path: Path, start: int = 0):
    """(index, text) of the documents of one shard, from document ``start``."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < start:
                continue
            text = json.loads(line)["text"]
            if text:
                yield i, text


def load_tokenizer(path):
    from tokenizers import Tokenizer
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"tokenizer file {p} does not exist")
    return Tokenizer.from_file(str(p))


def eos_id(tokenizer) -> int:
    for tok in EOS_CANDIDATES:
        i = tokenizer.token_to_id(tok)
        if i is not None:
            return i
    raise ValueError(f"the tokenizer has none of the end-of-text tokens {EOS_CANDIDATES}")


def train_tokenizer(data_dir, out_path, vocab_size: int = 32768, max_docs: int | None = None):
    """Train a byte-level BPE on the training shards (the fallback when no Llama 3.1
    tokenizer.json is supplied); EOS is <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        n = 0
        for shard in shards(data_dir, "train"):
            for _, t in iter_documents(shard):
                yield t
                n += 1
                if max_docs is not None and n >= max_docs:
                    return
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(), trainer)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_path))
    return tok


class TokenStream:
    """Endless packed sequences of ``seq_len + 1`` tokens (inputs and shifted targets) from the
    training shards, shard order shuffled per epoch from ``seed``."""

    def __init__(self, data_dir, tokenizer, seq_len: int, seed: int, state: dict | None = None,
                 split: str = "train", shuffle: bool = True):
        self.paths = shards(data_dir, split)
        self.tok = tokenizer
        self.eos = eos_id(tokenizer)
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle = shuffle
        st = state or {}
        self.epoch = st.get("epoch", 0)
        self.shard = st.get("shard", 0)
        self.doc = st.get("doc", 0)
        self.buffer = list(st.get("buffer", []))

    def order(self, epoch: int) -> list[Path]:
        paths = list(self.paths)
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(paths)
        return paths

    def state(self) -> dict:
        return {"epoch": self.epoch, "shard": self.shard, "doc": self.doc,
                "buffer": list(self.buffer)}

    def _fill(self, need: int):
        idle = 0  # shards passed in a row without any text
        while len(self.buffer) < need:
            path = self.order(self.epoch)[self.shard]
            added = False
            for i, text in iter_documents(path, self.doc):
                self.buffer.extend(self.tok.encode(text).ids)
                self.buffer.append(self.eos)
                self.doc = i + 1
                added = True
                if len(self.buffer) >= need:
                    return
            self.shard, self.doc = self.shard + 1, 0
            if self.shard == len(self.paths):
                self.shard, self.epoch = 0, self.epoch + 1
            idle = 0 if added else idle + 1
            if idle > len(self.paths):
                raise ValueError(f"the {len(self.paths)} shards hold no text")

    def next_batch(self, batch_size: int) -> torch.Tensor:
        """(batch_size, seq_len + 1) int64 tokens."""
        n = self.seq_len + 1
        rows = []
        for _ in range(batch_size):
            self._fill(n)
            rows.append(self.buffer[:n])
            del self.buffer[:n]
        return torch.tensor(rows, dtype=torch.int64)


def validation_set(data_dir, tokenizer, seq_len: int, n_sequences: int) -> torch.Tensor:
    """The first ``n_sequences`` packed sequences of the validation shards, in file order: a
    fixed held-out set (the MLPerf evaluation takes the first 1,024 sequences likewise)."""
    stream = TokenStream(data_dir, tokenizer, seq_len, seed=0, split="validation", shuffle=False)
    return stream.next_batch(n_sequences)


def write_shard(path, texts) -> None:
    """Write documents as one C4-format shard (gzip'd JSON lines with a "text" field)."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
