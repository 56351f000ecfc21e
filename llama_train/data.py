"""C4-format data: shards ``c4-train.*.json.gz`` / ``c4-validation.*.json.gz`` (AllenAI/MLPerf
layout: one JSON object per line with a ``"text"`` field), tokenized with HF ``tokenizers``,
EOS appended to every document, packed into fixed-length sequences.

Two training orders (``data_order``), both deterministic for a seed and resumable (``state()``
is a small dict saved with every checkpoint; a stream built with it continues exactly):
* 'shards' (``TokenStream``, the v1 ablation's): shard order shuffled per epoch, documents in
  file order, packed into consecutive sequences; state (epoch, shard, document, leftover tokens);
* 'sequences' (``SequenceStream``, the v2 ablation's): the split cut into fixed windows, visited
  in a seeded permutation drawn afresh each epoch; state (epoch, position).

Pre-tokenized cache: ``tokenize_split`` writes ``c4-<split>.tokens.npy`` (every shard's documents
in file order, EOS after each) and ``c4-<split>.tokens.json`` (shard names, their offsets, the
tokenizer's SHA-256). Where a cache matches the shards and the tokenizer, ``TokenStream`` reads
tokens from it instead of tokenizing on the fly: the sequences are the same token for token (a
test checks it), only the data position in ``state()`` is then a token offset.
"""
from __future__ import annotations

import gzip
import io
import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
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


def train_tokenizer(data_dir, out_path, vocab_size: int = 32768, max_docs: int | None = None,
                    max_chars: int | None = None):
    """Train a byte-level BPE on the training shards (the fallback when no Llama 3.1
    tokenizer.json is supplied); EOS is <|endoftext|>. ``max_docs`` / ``max_chars``: train on
    the first documents only (the shards in file order; a corpus whose shards are random
    samples, as debian-xl's, gives a random sample)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        n = chars = 0
        for shard in shards(data_dir, "train"):
            for _, t in iter_documents(shard):
                yield t
                n += 1
                chars += len(t)
                if (max_docs is not None and n >= max_docs) or \
                        (max_chars is not None and chars >= max_chars):
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


def tokenizer_sha256(tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def _cache_paths(data_dir, split: str) -> tuple[Path, Path]:
    d = Path(data_dir)
    return d / f"c4-{split}.tokens.npy", d / f"c4-{split}.tokens.json"


def _tokenize_shard(path, tokenizer, eos: int, dtype, batch: int) -> list:
    """One shard's documents as token arrays, each with ``eos`` appended, in document order."""
    texts = [t for _, t in iter_documents(path)]
    return [np.asarray(enc.ids + [eos], dtype=dtype)
            for i in range(0, len(texts), batch) for enc in tokenizer.encode_batch(texts[i:i + batch])]


def tokenize_split(data_dir, tokenizer, split: str = "train", batch: int = 1024,
                   workers: int | None = None) -> dict:
    """Tokenize every shard of a split once (``encode_batch``, all cores) into the cache files.
    Token ids are uint16 when the vocabulary fits, else uint32. Written to temporary names and
    renamed, so a cut-off run leaves no half cache.

    ``workers`` shards are tokenized at once (threads: ``encode_batch`` releases the GIL and
    shares one pool of all cores), so that a shard's longest documents, which one core encodes
    alone, overlap with other shards' work instead of leaving the other cores idle (on the device,
    one shard after another took 123 s on 64 cores). Default: a quarter of the cores, at most
    8. The cache is the same, byte for byte, for any ``workers`` and ``batch`` (documents per
    ``encode_batch`` call): shards keep their order."""
    from concurrent.futures import ThreadPoolExecutor
    eos = eos_id(tokenizer)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.uint32
    paths = shards(data_dir, split)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = workers or max(1, min(8, (cores or 1) // 4))
    parts, offsets, names = [], [0], []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = pool.map(lambda p: _tokenize_shard(p, tokenizer, eos, dtype, batch), paths)
        for path, arrays in zip(paths, done):
            parts.extend(arrays)
            offsets.append(offsets[-1] + sum(len(a) for a in arrays))
            names.append(path.name)
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
    npy, meta_path = _cache_paths(data_dir, split)
    meta = {"shards": names, "offsets": offsets, "tokens": int(len(tokens)),
            "dtype": np.dtype(dtype).name, "tokenizer_sha256": tokenizer_sha256(tokenizer)}
    tmp = npy.with_suffix(".tmp.npy")
    np.save(tmp, tokens)
    tmp.replace(npy)
    tmp = meta_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(meta_path)
    return meta


def load_cache(data_dir, tokenizer, split: str):
    """(tokens memmap, shard offsets) of a matching cache, or None (no cache, other shards, or
    another tokenizer)."""
    npy, meta_path = _cache_paths(data_dir, split)
    if not (npy.is_file() and meta_path.is_file()):
        return None
    meta = json.loads(meta_path.read_text())
    if (meta["shards"] != [p.name for p in shards(data_dir, split)]
            or meta["tokenizer_sha256"] != tokenizer_sha256(tokenizer)):
        return None
    return np.load(npy, mmap_mode="r"), meta["offsets"]


class TokenStream:
    """Endless packed sequences of ``seq_len + 1`` tokens (inputs and shifted targets) from the
    training shards, shard order shuffled per epoch from ``seed``; from the pre-tokenized cache
    where one matches (``cached``), else tokenized on the fly."""

    def __init__(self, data_dir, tokenizer, seq_len: int, seed: int, state: dict | None = None,
                 split: str = "train", shuffle: bool = True, use_cache: bool = True):
        self.paths = shards(data_dir, split)
        self.tok = tokenizer
        self.eos = eos_id(tokenizer)
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle = shuffle
        self.cache = load_cache(data_dir, tokenizer, split) if use_cache else None
        st = state or {}
        if st and ("offset" in st) != self.cached:
            saved, now = ("the cache", "on-the-fly tokenization") if "offset" in st else \
                ("on-the-fly tokenization", "the cache")
            raise ValueError(f"the saved data position was taken with {saved}, but this stream "
                             f"uses {now}: build or remove c4-{split}.tokens.* in {data_dir} "
                             "(ocpmx data tokenize) to match the checkpoint")
        self.epoch = st.get("epoch", 0)
        self.shard = st.get("shard", 0)
        self.doc = st.get("doc", 0)
        self.offset = st.get("offset", 0)
        self.buffer = list(st.get("buffer", []))

    @property
    def cached(self) -> bool:
        return self.cache is not None

    def order(self, epoch: int) -> list[Path]:
        paths = list(self.paths)
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(paths)
        return paths

    def state(self) -> dict:
        if self.cached:
            return {"epoch": self.epoch, "shard": self.shard, "offset": self.offset}
        return {"epoch": self.epoch, "shard": self.shard, "doc": self.doc,
                "buffer": list(self.buffer)}

    def _take(self, n: int) -> np.ndarray:
        """The next n tokens from the cache, across shard and epoch boundaries."""
        tokens, offsets = self.cache
        if offsets[-1] == 0:
            raise ValueError(f"the {len(self.paths)} shards hold no text")
        out, have = [], 0
        while have < n:
            i = self.paths.index(self.order(self.epoch)[self.shard])
            lo, hi = offsets[i] + self.offset, offsets[i + 1]
            k = min(n - have, hi - lo)
            out.append(tokens[lo:lo + k])
            have += k
            self.offset += k
            if offsets[i] + self.offset == hi:
                self._next_shard()
        return np.concatenate(out)

    def _next_shard(self):
        """Move to the start of the next shard (the next epoch after the last one)."""
        self.shard, self.doc, self.offset = self.shard + 1, 0, 0
        if self.shard == len(self.paths):
            self.shard, self.epoch = 0, self.epoch + 1

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
            self._next_shard()
            idle = 0 if added else idle + 1
            if idle > len(self.paths):
                raise ValueError(f"the {len(self.paths)} shards hold no text")

    def next_batch(self, batch_size: int) -> torch.Tensor:
        """(batch_size, seq_len + 1) int64 tokens."""
        n = self.seq_len + 1
        if self.cached:
            return torch.from_numpy(self._take(batch_size * n).astype(np.int64)).view(batch_size, n)
        rows = []
        for _ in range(batch_size):
            self._fill(n)
            rows.append(self.buffer[:n])
            del self.buffer[:n]
        return torch.tensor(rows, dtype=torch.int64)


def split_tokens(data_dir, tokenizer, split: str) -> np.ndarray:
    """Every token of a split in the cache's order (every shard's documents in file order, EOS
    after each): the cache where one matches, else tokenized in memory (small corpora; run
    ``ocpmx data tokenize`` for large ones)."""
    cache = load_cache(data_dir, tokenizer, split)
    if cache is not None:
        return cache[0]
    eos = eos_id(tokenizer)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.uint32
    parts = []
    for path in shards(data_dir, split):
        texts = [t for _, t in iter_documents(path)]
        for i in range(0, len(texts), 4096):
            parts += [np.asarray(e.ids + [eos], dtype=dtype)
                      for e in tokenizer.encode_batch(texts[i:i + 4096])]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


class SequenceStream:
    """Training sequences in a random order (``data_order='sequences'``): the split's tokens
    (``split_tokens``) cut into windows of ``seq_len + 1`` tokens at stride ``seq_len`` (window
    i = tokens[i * seq_len : (i + 1) * seq_len + 1], so every token is a target once per epoch),
    visited in a permutation drawn from (seed, epoch) afresh every epoch. A micro-batch is thus
    ``batch_size`` windows from anywhere in the corpus, never a run of consecutive ones.

    ``state()`` is {"order": "sequences", "epoch", "position", "windows", "seq_len"}; a stream
    built with it continues exactly where the saved one stopped (checked: same number of
    windows and sequence length)."""

    def __init__(self, data_dir, tokenizer, seq_len: int, seed: int, state: dict | None = None,
                 split: str = "train"):
        self.tokens = split_tokens(data_dir, tokenizer, split)
        self.seq_len = seq_len
        self.seed = seed
        self.windows = (len(self.tokens) - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"the {split} split holds {len(self.tokens)} tokens: fewer than one "
                             f"sequence of {seq_len + 1}")
        st = state or {}
        if st and st.get("order") != "sequences":
            raise ValueError("the saved data position was taken with data_order 'shards'; this "
                             "run uses 'sequences'")
        if st and (st["windows"], st["seq_len"]) != (self.windows, seq_len):
            raise ValueError(f"the saved data position is for {st['windows']} windows of "
                             f"{st['seq_len']} tokens; this split gives {self.windows} of "
                             f"{seq_len}: another corpus or tokenizer")
        self.epoch = st.get("epoch", 0)
        self.position = st.get("position", 0)
        self._perm_epoch, self._perm = None, None

    def permutation(self, epoch: int) -> np.ndarray:
        """The window order of an epoch: a permutation of range(windows) from (seed, epoch)."""
        if self._perm_epoch != epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch, 0x5E9]))
            self._perm, self._perm_epoch = rng.permutation(self.windows), epoch
        return self._perm

    def state(self) -> dict:
        return {"order": "sequences", "epoch": self.epoch, "position": self.position,
                "windows": self.windows, "seq_len": self.seq_len}

    def next_indices(self, n: int) -> np.ndarray:
        """The window indices of the next n sequences (across epoch boundaries)."""
        out = []
        while n:
            perm = self.permutation(self.epoch)
            k = min(n, self.windows - self.position)
            out.append(perm[self.position:self.position + k])
            self.position += k
            n -= k
            if self.position == self.windows:
                self.epoch, self.position = self.epoch + 1, 0
        return np.concatenate(out)

    def next_batch(self, batch_size: int) -> torch.Tensor:
        """(batch_size, seq_len + 1) int64 tokens."""
        L = self.seq_len
        rows = [np.asarray(self.tokens[i * L:i * L + L + 1], dtype=np.int64)
                for i in self.next_indices(batch_size)]
        return torch.from_numpy(np.stack(rows))


def open_stream(data_dir, tokenizer, seq_len: int, seed: int, state: dict | None = None,
                order: str = "shards"):
    """The training stream of ``data_order`` ``order``: TokenStream ('shards', v1) or
    SequenceStream ('sequences')."""
    if order == "sequences":
        return SequenceStream(data_dir, tokenizer, seq_len, seed, state)
    if state and state.get("order") == "sequences":
        raise ValueError("the saved data position was taken with data_order 'sequences'; this "
                         "run uses 'shards'")
    return TokenStream(data_dir, tokenizer, seq_len, seed, state)


def validation_set(data_dir, tokenizer, seq_len: int, n_sequences: int,
                   sampling: str = "first") -> torch.Tensor:
    """A fixed held-out set of ``n_sequences`` sequences of ``seq_len + 1`` tokens.
    'first': the first packed sequences of the validation shards, in file order (the MLPerf
    evaluation takes the first 1,024 sequences likewise); 'spread': windows evenly spaced over
    the whole validation split (every part of the corpus the split samples)."""
    if sampling == "spread":
        tokens = split_tokens(data_dir, tokenizer, "validation")
        windows = (len(tokens) - 1) // seq_len
        if windows < n_sequences:
            raise ValueError(f"the validation split holds {windows} sequences of {seq_len + 1} "
                             f"tokens; {n_sequences} were asked for")
        idx = (np.arange(n_sequences) * windows) // n_sequences
        return torch.from_numpy(np.stack([np.asarray(tokens[i * seq_len:(i + 1) * seq_len + 1],
                                                     dtype=np.int64) for i in idx]))
    if sampling != "first":
        raise ValueError(f"unknown validation sampling {sampling!r}")
    stream = TokenStream(data_dir, tokenizer, seq_len, seed=0, split="validation", shuffle=False)
    return stream.next_batch(n_sequences)


def write_shard(path, texts) -> None:
    """Write documents as one C4-format shard (gzip'd JSON lines with a "text" field).

    The gzip header holds no file name and a zero time stamp, so the same documents give the
    same bytes (a corpus rebuilt from its manifest is checked by the shards' SHA-256)."""
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
