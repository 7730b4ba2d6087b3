"""The local model hub against the real `huggingface_hub` and `modelscope` clients.

How the clients are pointed at the hub:
- huggingface_hub reads HF_ENDPOINT (and HF_HOME) into module constants at import time, so
  in-process tests pass ``endpoint=`` and ``cache_dir=``/``local_dir=`` explicitly (both public
  arguments); one test starts a fresh interpreter with HF_ENDPOINT/HF_HOME set to show the
  environment route the pipeline uses.
- modelscope (modelscope_hub underneath) reads MODELSCOPE_ENDPOINT / MODELSCOPE_CACHE once per
  process, into a lazily built default config (`modelscope_hub.config.get_default_config`). The
  fixture sets the variables and clears that config with the public `set_default_config(None)`,
  so each test goes through the real environment route against its own hub.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub.constants
import modelscope
import pytest
import requests
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from modelscope.hub.api import HubApi as MsHubApi
from modelscope_hub.config import set_default_config
from modelscope_hub.errors import FileDownloadError, FileIntegrityError

from k3deploy.localhub import HubServer, lfs_pointer, publish, resolve, set_ref

pytestmark = [pytest.mark.bed, pytest.mark.anywhere]  # the local hub itself, not the models stage

REPO = "k3test/tiny-model"
BIG = "model.safetensors"


def _files(seed: int) -> dict[str, bytes]:
    rnd = random.Random(seed)
    return {
        "config.json": json.dumps({"seed": seed, "hidden_size": 64}).encode(),
        "tokenizer/tokenizer.json": rnd.randbytes(3000),
        BIG: rnd.randbytes(1024 * 1024 + 4321),  # over 1 MiB: LFS
    }


@pytest.fixture
def published(tmp_path: Path) -> dict:
    """Two commits on `main` (v1 then v2) and a tag `v1` on the first."""
    root = tmp_path / "hub"
    v1, v2 = _files(1), _files(2)
    sha1 = publish(root, REPO, v1)
    sha2 = publish(root, REPO, v2)
    set_ref(root, REPO, "v1", sha1, tag=True)
    return {"root": root, "v1": v1, "v2": v2, "sha1": sha1, "sha2": sha2}


@pytest.fixture
def hub(published: dict):
    with HubServer(published["root"]) as server:
        yield server


@pytest.fixture
def ms_env(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point modelscope at the hub with its environment variables; caches under tmp."""
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    set_default_config(None)  # re-read the variables on the next call
    yield tmp_path / "ms-cache"
    set_default_config(None)


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF cache under tmp; also passed as cache_dir= since HF_HOME is read at import."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return tmp_path / "hf-home" / "hub"


def _read_tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and ".cache" not in p.parts
    }


def _get(url: str, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", path, headers=headers or {})
    return conn.getresponse()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_hf_snapshot_branch_resolves_and_old_revision_by_sha(
    hub: HubServer, published: dict, tmp_path: Path, hf_home: Path
) -> None:
    api = HfApi(endpoint=hub.url)
    assert api.model_info(REPO, revision="main").sha == published["sha2"]
    assert api.model_info(REPO, revision="v1").sha == published["sha1"]

    local = snapshot_download(REPO, revision="main", local_dir=tmp_path / "hf-main", endpoint=hub.url)
    assert _read_tree(Path(local)) == published["v2"]

    cached = snapshot_download(REPO, revision=published["sha1"], cache_dir=hf_home, endpoint=hub.url)
    assert Path(cached).name == published["sha1"]
    assert _read_tree(Path(cached)) == published["v1"]


def test_hf_file_metadata_matches_real_hub_shapes(hub: HubServer, published: dict, hf_home: Path) -> None:
    api, v2 = HfApi(endpoint=hub.url), published["v2"]
    path = hf_hub_download(REPO, BIG, revision="main", cache_dir=hf_home, endpoint=hub.url)
    assert Path(path).read_bytes() == v2[BIG]

    meta = get_hf_file_metadata(hf_hub_url(REPO, BIG, revision="main", endpoint=hub.url))
    assert (meta.commit_hash, meta.etag, meta.size) == (published["sha2"], _sha256(v2[BIG]), len(v2[BIG]))

    tree = {e.path: e for e in api.list_repo_tree(REPO, revision="main", recursive=True)}
    assert set(tree) == {"config.json", "tokenizer", "tokenizer/tokenizer.json", BIG}
    big = tree[BIG]
    assert (big.lfs.sha256, big.lfs.size, big.lfs.pointer_size) == (
        _sha256(v2[BIG]),
        len(v2[BIG]),
        len(lfs_pointer(_sha256(v2[BIG]), len(v2[BIG]))),
    )
    small = tree["config.json"]
    git_blob = hashlib.sha1(b"blob %d\0" % len(v2["config.json"]) + v2["config.json"]).hexdigest()
    assert (small.lfs, small.blob_id, small.size) == (None, git_blob, len(v2["config.json"]))

    siblings = {s.rfilename: s for s in api.model_info(REPO, revision="main", files_metadata=True).siblings}
    assert siblings[BIG].lfs.sha256 == _sha256(v2[BIG])
    assert siblings["config.json"].lfs is None


def test_hf_tree_follows_pagination(published: dict) -> None:
    with HubServer(published["root"], page_size=2) as hub:
        paths = [e.path for e in HfApi(endpoint=hub.url).list_repo_tree(REPO, revision="main", recursive=True)]
        tree_calls = [r for r in hub.requests if "/tree/" in r.path]
    assert sorted(paths) == ["config.json", BIG, "tokenizer", "tokenizer/tokenizer.json"]
    assert len(tree_calls) == 2 and "cursor=2" in tree_calls[1].path


def test_hf_errors_map_to_client_exceptions(hub: HubServer, hf_home: Path) -> None:
    api = HfApi(endpoint=hub.url)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("k3test/absent", revision="main")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.txt", revision="main", cache_dir=hf_home, endpoint=hub.url)


def test_hf_endpoint_from_environment_in_fresh_interpreter(hub: HubServer, published: dict, tmp_path: Path) -> None:
    """HF_ENDPOINT is read at import, so the environment route is shown in a new process."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-env"), "HF_HUB_OFFLINE": "0"}
    code = f"from huggingface_hub import snapshot_download; print(snapshot_download({REPO!r}, revision='main'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    snapshot = Path(out.stdout.strip().splitlines()[-1])
    assert snapshot.is_relative_to(tmp_path / "hf-env") and snapshot.name == published["sha2"]
    assert _read_tree(snapshot) == published["v2"]


def test_modelscope_snapshot_branch_and_sha(hub: HubServer, published: dict, ms_env: Path, tmp_path: Path) -> None:
    main = modelscope.snapshot_download(REPO, revision="main")
    assert Path(main).is_relative_to(ms_env)
    assert _read_tree(Path(main)) == published["v2"]

    old = modelscope.snapshot_download(REPO, revision=published["sha1"], local_dir=str(tmp_path / "ms-v1"))
    assert _read_tree(Path(old)) == published["v1"]

    listing = json.loads(_get(hub.url, f"/api/v1/models/{REPO}/repo/files?Revision=main&Recursive=True").read())
    files = {f["Path"]: f for f in listing["Data"]["Files"]}
    big = files[BIG]
    assert (big["Sha256"], big["Size"], big["IsLFS"], big["Type"], big["Name"], big["Revision"]) == (
        _sha256(published["v2"][BIG]),
        len(published["v2"][BIG]),
        True,
        "blob",
        BIG,
        published["sha2"],
    )
    assert files["tokenizer"]["Type"] == "tree" and files["config.json"]["IsLFS"] is False


def test_modelscope_revisions_subfolder_and_missing_repo(
    hub: HubServer, published: dict, ms_env: Path, tmp_path: Path
) -> None:
    branches, tags = MsHubApi().get_model_branches_and_tags_details(REPO)
    assert [(b["Revision"], b["CommitId"]) for b in branches] == [("main", published["sha2"])]
    assert [(t["Revision"], t["CommitId"]) for t in tags] == [("v1", published["sha1"])]

    sub = modelscope.snapshot_download(
        REPO, revision="v1", local_dir=str(tmp_path / "tok"), allow_patterns=["tokenizer/*"]
    )
    assert _read_tree(Path(sub)) == {"tokenizer/tokenizer.json": published["v1"]["tokenizer/tokenizer.json"]}
    assert any("Root=tokenizer" in r.path for r in hub.requests)

    # A missing folder is a 404 on the listing; the client then checks the repo exists and gets nothing.
    empty = modelscope.snapshot_download(
        REPO, revision="main", local_dir=str(tmp_path / "none"), allow_patterns=["absent/*"]
    )
    assert _read_tree(Path(empty)) == {}
    with pytest.raises(requests.exceptions.HTTPError):
        modelscope.snapshot_download("k3test/absent", revision="main", local_dir=str(tmp_path / "x"))


@pytest.mark.parametrize("route", ["hf", "ms"])
def test_range_requests_return_206_slices(hub: HubServer, published: dict, route: str) -> None:
    data = published["v2"][BIG]
    path = (
        f"/{REPO}/resolve/main/{BIG}" if route == "hf" else f"/api/v1/models/{REPO}/repo?Revision=main&FilePath={BIG}"
    )
    resp = _get(hub.url, path, {"Range": "bytes=1000-1999"})
    assert (resp.status, resp.getheader("Content-Range"), resp.read()) == (
        206,
        f"bytes 1000-1999/{len(data)}",
        data[1000:2000],
    )
    resp = _get(hub.url, path, {"Range": "bytes=-100"})
    assert (resp.status, resp.read()) == (206, data[-100:])
    resp = _get(hub.url, path, {"Range": f"bytes={len(data)}-"})
    resp.read()
    assert (resp.status, resp.getheader("Content-Range")) == (416, f"bytes */{len(data)}")
    resp = _get(hub.url, path)
    assert (resp.status, resp.getheader("X-Repo-Commit"), resp.read()) == (200, published["sha2"], data)


@pytest.mark.faults
def test_corrupt_file_hf_accepts_modelscope_rejects(
    hub: HubServer, published: dict, ms_env: Path, hf_home: Path
) -> None:
    good = published["v2"][BIG]
    hub.faults.corrupt(REPO, BIG)

    # huggingface_hub does not verify sha256: it keeps bytes that do not match the listed hash ...
    api = HfApi(endpoint=hub.url)
    folder = Path(snapshot_download(REPO, revision="main", cache_dir=hf_home, endpoint=hub.url))
    got = (folder / BIG).read_bytes()
    listed = {e.path: e for e in api.list_repo_tree(REPO, revision="main", recursive=True)}
    assert len(got) == len(good) and got != good
    assert listed[BIG].lfs.sha256 == _sha256(good) != _sha256(got)
    # ... only a separate check against the listing (git blob ids and LFS sha256) finds it.
    report = api.verify_repo_checksums(REPO, revision=folder.name, cache_dir=hf_home)
    assert [(m["path"], m["algorithm"]) for m in report.mismatches] == [(BIG, "sha256")] and report.checked_count == 3

    # modelscope verifies against the listed Sha256 and gives up after its retries.
    with pytest.raises(FileDownloadError) as failed:
        modelscope.snapshot_download(REPO, revision="main", allow_patterns=[BIG])
    assert isinstance(failed.value.failed_files[BIG], FileIntegrityError)

    hub.faults.clear()
    healed = modelscope.snapshot_download(REPO, revision="main", allow_patterns=[BIG])
    assert (Path(healed) / BIG).read_bytes() == good


@pytest.mark.faults
def test_dropped_hash_leaves_clients_without_sha256(
    hub: HubServer, published: dict, ms_env: Path, tmp_path: Path
) -> None:
    good = published["v2"][BIG]
    hub.faults.drop_hash(REPO, BIG)
    entry = {e.path: e for e in HfApi(endpoint=hub.url).list_repo_tree(REPO, revision="main", recursive=True)}[BIG]
    meta = get_hf_file_metadata(hf_hub_url(REPO, BIG, revision="main", endpoint=hub.url))
    assert entry.lfs is None and meta.etag == entry.blob_id != _sha256(good)
    listing = json.loads(_get(hub.url, f"/api/v1/models/{REPO}/repo/files?Revision=main&Recursive=True").read())
    assert {f["Path"]: f["Sha256"] for f in listing["Data"]["Files"]}[BIG] == ""

    # With no hash to check against, modelscope accepts corrupted bytes too.
    hub.faults.corrupt(REPO, BIG)
    got = modelscope.snapshot_download(REPO, revision="main", local_dir=str(tmp_path / "ms"), allow_patterns=[BIG])
    assert (Path(got) / BIG).read_bytes() != good


@pytest.mark.faults
@pytest.mark.parametrize("client", ["hf", "ms"])
def test_truncated_transfer_is_resumed_with_range(
    published: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """A cut transfer is resumed with a Range request from the last byte the client kept.

    modelscope keeps every byte it received and resumes at the cut; huggingface_hub keeps only
    whole 10 MiB read chunks, so it resumes at the cut rounded down to 10 MiB (a cut inside the
    first 10 MiB restarts from 0) — hence a 12 MiB file cut past 11 MiB.
    """
    data = random.Random(3).randbytes(12 * 1024 * 1024)
    cut, name = 11 * 1024 * 1024 + 4321, "big/model-00001.safetensors"
    publish(published["root"], "k3test/big", {name: data})
    with HubServer(published["root"]) as hub:
        hub.faults.truncate("k3test/big", name, at=cut, times=1)
        if client == "hf":
            chunk = huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE
            kept = cut - cut % chunk
            got = hf_hub_download("k3test/big", name, revision="main", cache_dir=tmp_path / "hf", endpoint=hub.url)
        else:
            kept = cut
            monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
            set_default_config(None)
            folder = modelscope.snapshot_download("k3test/big", revision="main", local_dir=str(tmp_path / "ms"))
            set_default_config(None)
            got = Path(folder) / name
        gets = [(r.range, r.status, r.sent) for r in hub.requests if r.method == "GET" and "model-00001" in r.path]
    assert Path(got).read_bytes() == data
    assert gets == [(None, 200, cut), (f"bytes={kept}-", 206, len(data) - kept)]


@pytest.mark.faults
def test_persistent_truncation_cuts_every_response_at_the_offset(hub: HubServer, published: dict) -> None:
    good, cut = published["v2"][BIG], 100_000
    hub.faults.truncate(REPO, BIG, at=cut, times=None)
    for start in (0, 50_000, cut):
        resp = _get(hub.url, f"/{REPO}/resolve/main/{BIG}", {"Range": f"bytes={start}-"})
        with pytest.raises(http.client.IncompleteRead) as short:
            resp.read()
        assert short.value.partial == good[start:cut]
    tail = _get(hub.url, f"/{REPO}/resolve/main/{BIG}", {"Range": f"bytes={cut + 1}-"})
    assert tail.read() == good[cut + 1 :]


@pytest.mark.faults
def test_slow_file_is_paced(hub: HubServer, published: dict) -> None:
    data, rate = published["v2"]["tokenizer/tokenizer.json"], 10_000
    hub.faults.slow(REPO, "tokenizer/tokenizer.json", rate=rate)
    began = time.monotonic()
    assert _get(hub.url, f"/{REPO}/resolve/main/tokenizer/tokenizer.json").read() == data
    assert time.monotonic() - began >= 0.9 * len(data) / rate


@pytest.mark.faults
def test_admin_endpoint_sets_lists_and_clears_faults(hub: HubServer, published: dict) -> None:
    good = published["v2"]["config.json"]
    admin = f"{hub.url}/_admin/faults"
    spec = {"kind": "corrupt", "repo": REPO, "path": "config.json"}
    assert requests.post(admin, json=spec, timeout=10).json()[0]["corrupt"] is True
    assert _get(hub.url, f"/{REPO}/resolve/main/config.json").read() == bytes(255 - b for b in good)
    assert requests.post(admin, json={**spec, "kind": "melt"}, timeout=10).status_code == 400
    assert requests.delete(admin, timeout=10).json() == []
    assert _get(hub.url, f"/{REPO}/resolve/main/config.json").read() == good
    logged = requests.get(f"{hub.url}/_admin/requests", timeout=10).json()
    assert {
        "method": "GET",
        "path": f"/{REPO}/resolve/main/config.json",
        "range": None,
        "status": 200,
        "sent": len(good),
        "authorized": False,
    } in logged


def test_cli_serves_a_root(published: dict) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "k3deploy.localhub", "--root", str(published["root"]), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        info = json.loads(_get(url, f"/api/models/{REPO}/revision/main").read())
        assert info["sha"] == published["sha2"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_commit_and_tree_ids_are_git_ids(published: dict, tmp_path: Path) -> None:
    """What the hub reports as tree/blob ids is what git computes for the same files (LFS as pointers)."""
    commit = resolve(published["root"], REPO, "main")
    work = tmp_path / "git"
    for path, data in published["v2"].items():
        entry = commit.files[path]
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_bytes(lfs_pointer(entry.sha256, entry.size) if entry.lfs else data)
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    tree = subprocess.run(["git", "-C", str(work), "write-tree"], check=True, capture_output=True, text=True)
    assert tree.stdout.strip() == commit.tree
    assert commit.parent == published["sha1"]
    assert publish(published["root"], REPO, published["v2"]) == published["sha2"]  # same files: no new commit


def test_modelscope_listing_gives_each_file_the_commit_that_last_changed_it(tmp_path):
    """As the real hub does (its SDK reads a file's `Revision` as that file's commit id, dated by
    `CommittedDate`): a repo with history lists older commits for unchanged files, and the models stage
    takes the newest as the repo's commit instead of refusing a listing that names several."""
    from k3deploy.localhub import HubServer, publish
    from k3deploy.tasks.models.listing import list_modelscope

    with HubServer(tmp_path / "hub") as hub:
        first = publish(hub.root, "k3test/history", {"a.json": b"{}", "b.bin": b"1"}, created=1_700_000_000)
        second = publish(hub.root, "k3test/history", {"a.json": b"{}", "b.bin": b"2"}, created=1_700_000_100)
        data = requests.get(f"{hub.url}/api/v1/models/k3test/history/repo/files",
                            params={"Revision": "main", "Recursive": "True"}, timeout=30).json()  # fmt: skip
        revisions = {f["Path"]: (f["Revision"], f["CommittedDate"]) for f in data["Data"]["Files"]}
        assert revisions == {"a.json": (first, 1_700_000_000), "b.bin": (second, 1_700_000_100)}
        listing = list_modelscope("k3test/history", "main", hub.url, None)
        assert listing.commit == second and {f.path for f in listing.files} == {"a.json", "b.bin"}


@pytest.mark.faults
def test_failing_file_answers_the_status_the_next_n_gets_then_serves_it(hub: HubServer, published: dict) -> None:
    """A hub having a bad moment: the first GETs of one file answer 503, HEAD and other files are untouched."""
    good = published["v2"][BIG]
    hub.faults.fail(REPO, BIG, status=503, times=2)
    url = f"/{REPO}/resolve/main/{BIG}"
    assert requests.head(f"{hub.url}{url}", timeout=10).status_code == 200
    assert _get(hub.url, f"/{REPO}/resolve/main/config.json").read() == published["v2"]["config.json"]
    answers = [_get(hub.url, url) for _ in range(3)]
    assert [a.status for a in answers] == [503, 503, 200]
    assert answers[2].read() == good
    gets = [(r.status, r.sent) for r in hub.requests if r.method == "GET" and r.path == url]
    assert gets[2] == (200, len(good)) and [s for s, _ in gets] == [503, 503, 200]


@pytest.mark.faults
def test_persistent_failure_answers_every_get(hub: HubServer) -> None:
    hub.faults.fail(REPO, BIG, status=500, times=None)
    assert [_get(hub.url, f"/{REPO}/resolve/main/{BIG}").status for _ in range(4)] == [500] * 4
    hub.faults.clear(REPO, BIG)
    assert _get(hub.url, f"/{REPO}/resolve/main/{BIG}").status == 200


@pytest.mark.faults
def test_stalled_transfer_sends_nothing_with_the_connection_open_until_cleared(hub: HubServer, published: dict) -> None:
    """The bytes before `at` arrive, then nothing (and no end of stream) until the switch is cleared; then the rest."""
    good, at = published["v2"][BIG], 300_000
    hub.faults.stall(REPO, BIG, at=at, times=None)
    parts = urlsplit(hub.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"/{REPO}/resolve/main/{BIG}")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Length") == str(len(good))
    assert resp.read(at) == good[:at]
    assert select.select([conn.sock], [], [], 1.0)[0] == []  # neither a byte nor a close for a second
    resumed = _get(hub.url, f"/{REPO}/resolve/main/{BIG}", {"Range": f"bytes={at}-"})
    assert resumed.read() == good[at:]  # a resume from the stall point is not stalled
    hub.faults.clear(REPO, BIG)
    assert resp.read() == good[at:]
    conn.close()


@pytest.mark.faults
def test_stall_for_some_seconds_then_the_rest_and_only_times_responses(hub: HubServer, published: dict) -> None:
    good, at, pause = published["v2"][BIG], 200_000, 0.5
    requests.post(
        f"{hub.url}/_admin/faults",
        json={"kind": "stall", "repo": REPO, "path": BIG, "at": at, "seconds": pause, "times": 1},
        timeout=10,
    ).raise_for_status()
    began = time.monotonic()
    assert _get(hub.url, f"/{REPO}/resolve/main/{BIG}").read() == good
    assert time.monotonic() - began >= pause
    assert hub.faults.get(REPO, BIG).stall_at is None  # used up: the next transfer is not stalled
    assert _get(hub.url, f"/{REPO}/resolve/main/{BIG}", {"Range": "bytes=0-"}).read() == good


@pytest.mark.faults
def test_stopping_the_hub_releases_a_stalled_transfer(published: dict) -> None:
    good, at = published["v2"][BIG], 100_000
    hub = HubServer(published["root"]).start()
    hub.faults.stall(REPO, BIG, at=at, times=None)
    resp = _get(hub.url, f"/{REPO}/resolve/main/{BIG}")
    assert resp.read(at) == good[:at] and hub.faults.stalled(REPO, BIG) == 1
    hub.stop()
    deadline = time.monotonic() + 10
    while hub.faults.stalled() and time.monotonic() < deadline:  # the handler thread wakes and goes on
        time.sleep(0.05)
    assert hub.faults.stalled() == 0
    assert hub.faults.get(REPO, BIG).stall_at == at  # the switch itself stays set
    try:
        rest = resp.read()
    except http.client.IncompleteRead as cut:  # the socket closed under it: fine too, as long as it ends
        rest = cut.partial
    assert good[at:].startswith(rest)
