"""The public datasets handformer's configs, tests and benchmarks name, and where each file comes
from: a pinned public URL, its size and its sha256. The project ships none of them;
`handformer data get NAME` downloads one (data/download.py) and data/lookup.py finds it.

The digests are those of the copies this project's own machines train and test on; each URL is a
commit of the file's public repository holding exactly those bytes (checked by git's blob hash).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_CHAR_RNN = "https://raw.githubusercontent.com/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e"
_MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a"
_LLAMA2_ZIG = "https://raw.githubusercontent.com/clebert/llama2.zig/46af05d7ed3e37b41b9049a4cc5c092c8a683a29"


@dataclass(frozen=True)
class RemoteFile:
    name: str  # the file's name in its dataset's folder (CACHE/DATASET/NAME)
    url: str  # where `handformer data get` downloads it from
    size: int  # bytes
    sha256: str  # hex digest; a download that differs is not kept


@dataclass(frozen=True)
class Dataset:
    name: str  # the folder name and what configs write: [data] dataset = "NAME"
    about: str  # one line for `handformer data list`
    files: tuple[RemoteFile, ...]
    text: str = ""  # the file a language model trains on ([data] dataset = NAME); "" = none
    # translation: split (train, val, test) -> its files' name with {lang} for the language
    splits: dict[str, str] = field(default_factory=dict)

    def file(self, name: str) -> RemoteFile:
        for f in self.files:
            if f.name == name:
                return f
        raise ValueError(f"dataset {self.name!r} has no file {name!r}; its files: "
                         f"{', '.join(f.name for f in self.files)}")


def _multi30k(split: str, lang: str, size: int, sha256: str) -> RemoteFile:
    name = f"{split}.{lang}.gz"
    return RemoteFile(name, f"{_MULTI30K}/data/task1/raw/{name}", size, sha256)


TINYSHAKESPEARE = Dataset(
    "tinyshakespeare", "Shakespeare, 1,115,394 characters: the char-rnn / nanoGPT character-level corpus",
    (RemoteFile("input.txt", f"{_CHAR_RNN}/data/tinyshakespeare/input.txt", 1_115_394,
                "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),), text="input.txt")

MULTI30K = Dataset(
    "multi30k", "Multi30k task 1 image captions, de/en/fr, train 29,000 / val 1,014 / test 1,000 lines",
    (_multi30k("train", "de", 637_044, "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
     _multi30k("train", "en", 568_929, "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
     _multi30k("train", "fr", 604_242, "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c"),
     _multi30k("val", "de", 24_681, "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
     _multi30k("val", "en", 21_650, "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
     _multi30k("val", "fr", 23_001, "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9"),
     _multi30k("test_2016_flickr", "de", 22_890,
               "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
     _multi30k("test_2016_flickr", "en", 21_077,
               "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
     _multi30k("test_2016_flickr", "fr", 22_310,
               "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90")),
    splits={"train": "train.{lang}.gz", "val": "val.{lang}.gz", "test": "test_2016_flickr.{lang}.gz"})

# karpathy's tinyllamas stories260K, llama2.c's legacy format, and its 512-token tokenizer
STORIES260K = Dataset(
    "stories260K", "llama2.c's trained 260K-parameter TinyStories Llama and its 512-token tokenizer",
    (RemoteFile("stories260K.bin", f"{_LLAMA2_ZIG}/models/tinystories_260k/checkpoint_legacy.bin",
                1_056_540, "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696"),
     RemoteFile("tok512.bin", f"{_LLAMA2_ZIG}/models/tinystories_260k/tokenizer.bin", 6_227,
                "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312")))

DATASETS: dict[str, Dataset] = {d.name: d for d in (TINYSHAKESPEARE, MULTI30K, STORIES260K)}


def dataset(name: str) -> Dataset:
    """The dataset called `name`, or an error listing the known ones."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)} "
                         "(or give a file with path = ...)")
    return DATASETS[name]
