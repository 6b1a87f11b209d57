"""Public datasets on a user's machine: the download is checked by sha256 and written atomically
(a mismatch or a connection closed mid-body leaves nothing under the final name, and a retry
works), the lookup order is $HANDFORMER_DATA, the user's cache, ../shared/data beside the clone,
then the download, and an offline machine gets one error line saying what to run. Every download
here is from a local HTTP server on 127.0.0.1; nothing reaches the internet."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import io
import socket
import threading
from pathlib import Path

import pytest

from handformer.cli import main
from handformer.data import lookup, sources
from handformer.data.download import DownloadError, download
from handformer.data.sources import Dataset, RemoteFile

BODY = b"To be, or not to be, that is the question.\n" * 500  # 21,500 bytes


class Handler(http.server.BaseHTTPRequestHandler):
    """/good: the body; /other: other bytes of the same size; /cut: half the body, then the
    connection closes; /watch: half, a look at the destination folder, then the rest."""

    def do_GET(self) -> None:
        body = bytes(reversed(BODY)) if self.path == "/other" else BODY
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in ("/cut", "/watch"):
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            if self.path == "/cut":
                return
            self.server.seen = sorted(p.name for p in self.server.watch.iterdir())  # type: ignore[attr-defined]
            body = body[len(body) // 2:]
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def url(server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


@pytest.fixture
def refused():
    """A URL on a port that is bound (so no one else takes it) but not listening: connection refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/good"
    sock.close()


def remote(address: str) -> RemoteFile:
    return RemoteFile("f.txt", address, len(BODY), hashlib.sha256(BODY).hexdigest())


def test_a_download_is_checked_and_written_under_its_name(server, tmp_path):
    assert download(remote(url(server, "/good")), tmp_path / "d" / "f.txt").read_bytes() == BODY
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["f.txt"]


def test_a_file_whose_sha256_differs_is_not_kept(server, tmp_path):
    with pytest.raises(DownloadError, match="sha256 is .* not the published .* it was not kept"):
        download(remote(url(server, "/other")), tmp_path / "f.txt")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_download_leaves_nothing_and_a_retry_works(server, tmp_path):
    with pytest.raises(DownloadError, match="closed early|IncompleteRead|failed"):
        download(remote(url(server, "/cut")), tmp_path / "f.txt")
    assert list(tmp_path.iterdir()) == []
    assert download(remote(url(server, "/good")), tmp_path / "f.txt").read_bytes() == BODY


def test_the_final_name_appears_only_once_every_byte_is_checked(server, tmp_path):
    server.watch = tmp_path
    download(remote(url(server, "/watch")), tmp_path / "f.txt")
    assert len(server.seen) == 1 and server.seen[0].startswith(".f.txt.")  # half written: the temporary file only
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_no_network_is_one_error_naming_the_url(refused, tmp_path):
    with pytest.raises(DownloadError, match="failed: Connection refused"):
        download(remote(refused), tmp_path / "f.txt")
    assert list(tmp_path.iterdir()) == []


# --- the lookup ----------------------------------------------------------------------------------

@pytest.fixture
def places(tmp_path, monkeypatch) -> dict[str, Path]:
    """$HANDFORMER_DATA, the cache and ../shared/data in tmp_path, all empty."""
    folders = {"env": tmp_path / "env", "cache": tmp_path / "xdg" / "handformer", "clone": tmp_path / "shared"}
    monkeypatch.setenv(lookup.ENV, str(folders["env"]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(lookup, "beside_clone", lambda: folders["clone"])
    return folders


def tiny(monkeypatch, address: str) -> Dataset:
    ds = Dataset("tiny", "a test corpus", (remote(address),), text="f.txt")
    monkeypatch.setitem(sources.DATASETS, "tiny", ds)
    return ds


def put(folder: Path, body: bytes = BODY) -> Path:
    (folder / "tiny").mkdir(parents=True, exist_ok=True)
    (folder / "tiny" / "f.txt").write_bytes(body)
    return folder / "tiny" / "f.txt"


def test_the_lookup_order_is_env_then_cache_then_beside_the_clone(places, monkeypatch, refused):
    tiny(monkeypatch, refused)
    assert lookup.find("tiny", "f.txt") is None
    for where in ("clone", "cache", "env"):  # each place found, and it wins over the ones after it
        path = put(places[where])
        assert lookup.locate("tiny", "f.txt") == path
    monkeypatch.delenv(lookup.ENV)
    assert lookup.locate("tiny", "f.txt") == places["cache"] / "tiny" / "f.txt"


def test_a_found_file_of_another_size_is_an_error_saying_what_to_do(places, monkeypatch, refused):
    tiny(monkeypatch, refused)
    put(places["env"], BODY[:-1])
    with pytest.raises(ValueError, match="21,499 bytes, not the published 21,500.*remove it"):
        lookup.locate("tiny", "f.txt")


def test_a_missing_file_is_downloaded_into_the_cache_once(places, monkeypatch, server):
    tiny(monkeypatch, url(server, "/good"))
    lines: list[str] = []
    assert lookup.locate("tiny", "f.txt", log=lines.append) == places["cache"] / "tiny" / "f.txt"
    assert len(lines) == 1 and "sha256 checked" in lines[0]
    tiny(monkeypatch, url(server, "/other"))  # the cached copy is found: no second download
    assert lookup.locate("tiny", "f.txt", log=lines.append).read_bytes() == BODY and len(lines) == 1


def test_offline_the_lookup_says_what_to_run_and_where_to_put_the_file(places, monkeypatch, refused):
    tiny(monkeypatch, refused)
    with pytest.raises(lookup.DataUnavailable) as err:
        lookup.locate("tiny", "f.txt")
    message = str(err.value)
    assert "Connection refused" in message and "`handformer data get tiny`" in message
    assert f"put f.txt in {places['cache'] / 'tiny'}" in message and "HANDFORMER_DATA" in message
    with pytest.raises(lookup.DataUnavailable, match="not on this machine: run `handformer data get tiny`"):
        lookup.locate("tiny", "f.txt", download=False)


# --- the command line and the configs -----------------------------------------------------------

def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_data_get_downloads_and_data_list_says_where_each_dataset_is(places, monkeypatch, server):
    assert run_cli("data", "list")[0] == 0  # the command line's parser is built before "tiny" is a dataset
    tiny(monkeypatch, url(server, "/good"))
    rc, out, _ = run_cli("data", "list")
    assert rc == 0 and "tiny             missing: run `handformer data get tiny`" in out
    assert out.index(str(places["env"])) < out.index(str(places["cache"])) < out.index(str(places["clone"]))
    rc, out, err = run_cli("data", "get", "tiny")
    assert rc == 0 and (places["cache"] / "tiny" / "f.txt").read_bytes() == BODY, err
    assert f"tiny             here: {places['cache'] / 'tiny'} (the user's cache)" in run_cli("data", "list")[1]
    assert run_cli("data", "path", "tiny")[1] == f"{places['cache'] / 'tiny'}\n"
    assert run_cli("data", "path", "tiny", "f.txt")[1] == f"{places['cache'] / 'tiny' / 'f.txt'}\n"


def test_offline_data_get_and_train_print_one_error_line(places, monkeypatch, refused, tmp_path):
    tiny(monkeypatch, refused)
    rc, _, err = run_cli("data", "get", "tiny")
    assert rc == 2 and err.count("\n") == 1 and "run `handformer data get tiny`" in err
    config = tmp_path / "job.toml"
    config.write_text('task = "lm"\n[data]\ndataset = "tiny"\n')
    rc, _, err = run_cli("train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert rc == 2 and err.count("\n") == 1 and "put f.txt in" in err
    assert not (tmp_path / "run").exists()


def test_a_config_names_a_dataset_and_a_path_beside_it_wins(places, monkeypatch, refused, tmp_path):
    from handformer.tasks.lm.job import LMDataConfig

    tiny(monkeypatch, refused)
    put(places["env"])
    assert LMDataConfig.from_dict({"dataset": "tiny"}).text_path() == str(places["env"] / "tiny" / "f.txt")
    assert LMDataConfig.from_dict({"dataset": "tiny", "path": "my.txt"}).text_path() == "my.txt"
    with pytest.raises(ValueError, match=r"\[data\] dataset='nope' is invalid: give one of .*tinyshakespeare"):
        LMDataConfig.from_dict({"dataset": "nope"})
    with pytest.raises(ValueError, match="dataset='stories260K' is invalid"):  # not a text corpus
        LMDataConfig.from_dict({"dataset": "stories260K"})


def test_a_translation_config_takes_a_parallel_datasets_splits(places, monkeypatch, refused):
    from handformer.tasks.translation.job import TranslationDataConfig, load_pairs

    bodies = {f"{split}.{lang}.gz": gzip.compress(f"{line} {split}\n".encode(), mtime=0)
              for split in ("train", "val", "test") for lang, line in (("de", "ein Hund"), ("en", "a dog"))}
    files = tuple(RemoteFile(name, refused, len(body), hashlib.sha256(body).hexdigest())
                  for name, body in bodies.items())
    splits = {split: f"{split}.{{lang}}.gz" for split in ("train", "val", "test")}
    monkeypatch.setitem(sources.DATASETS, "pairs", Dataset("pairs", "a test corpus", files, splits=splits))
    (places["env"] / "pairs").mkdir(parents=True)
    for name, body in bodies.items():
        (places["env"] / "pairs" / name).write_bytes(body)
    train, val, test = load_pairs(TranslationDataConfig.from_dict({"dataset": "pairs", "languages": ["de", "en"]}))
    assert (train.pairs, val.pairs, test.pairs) == ([("ein Hund train", "a dog train")],
                                                    [("ein Hund val", "a dog val")], [("ein Hund test", "a dog test")])
    with pytest.raises(ValueError, match=r"\[data\] languages=\['de', 'xx'\] is invalid: give \[source, target\], two of de, en"):
        TranslationDataConfig.from_dict({"dataset": "pairs", "languages": ["de", "xx"]})
    (places["env"] / "my.de").write_text("mein Hund\n")
    (places["env"] / "my.en").write_text("my dog\n")
    mine = [str(places["env"] / "my.de"), str(places["env"] / "my.en")]
    _, val, test = load_pairs(TranslationDataConfig.from_dict({"dataset": "pairs", "languages": ["de", "en"],
                                                                "val": mine}))
    assert (val.pairs, test.pairs) == ([("mein Hund", "my dog")], [("ein Hund test", "a dog test")])
    with pytest.raises(ValueError, match="give a dataset or train files"):
        TranslationDataConfig.from_dict({"dataset": "pairs", "languages": ["de", "en"], "train": mine})


def test_no_shipped_config_reads_a_folder_only_this_projects_machines_have():
    """configs/ and the built-in configs name public datasets (found or downloaded), never ../shared."""
    from handformer.tasks.job_file import load_job_file

    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "configs").glob("*.toml")) + sorted((root / "handformer" / "configs").glob("*.toml"))
    named = set()
    for path in files:
        assert "shared/" not in path.read_text(), path.name
        named.add(load_job_file(path).get("data", {}).get("dataset"))
    assert {"tinyshakespeare", "multi30k"} <= named <= {None, *sources.DATASETS}


def test_a_run_trained_on_a_dataset_records_its_name_and_eval_finds_the_text_again(places, monkeypatch, refused,
                                                                                   tmp_path):
    import json

    tiny(monkeypatch, refused)
    put(places["env"])
    config = tmp_path / "job.toml"
    config.write_text('task = "lm"\n[data]\ndataset = "tiny"\nblock_size = 16\nbatch_size = 4\n'
                      "[model]\nd_model = 16\nn_heads = 2\nd_ff = 32\nn_layers = 1\n"
                      "[train]\nsteps = 2\neval_every = 2\nprogress = false\ndevice = \"cpu\"\n")
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli("train", "--config", str(config), "--out", "run")
    assert rc == 0, err
    assert f"characters from {places['env'] / 'tiny' / 'f.txt'}" in out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["dataset"] == "tiny"
    (places["env"] / "tiny" / "f.txt").unlink()  # eval looks the text up again: gone, then in the cache
    rc, _, err = run_cli("eval", "run", "--data", "val")
    assert rc == 2 and err.count("\n") == 1 and "tiny/f.txt is not on this machine" in err
    put(places["cache"])
    rc, out, err = run_cli("eval", "run", "--data", "val")
    assert rc == 0 and "loss" in out, err
