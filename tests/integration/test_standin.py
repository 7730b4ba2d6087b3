"""The stand-in vLLM-Ascend image and its `vllm serve` / `pip` stand-ins (testbed/standin).

The first tests run the stand-in with this machine's python3 on loopback; the `testbed` ones
run the image on bed hosts through the docker SDK over SSH, as the image and launch stages will.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from k3deploy.blocks import parse_config
from k3deploy.tasks.render import render_plan
from testbed.standin import image as standin_image
from testbed.standin import vllm_standin
from tests.configs import site_data, with_changes

if TYPE_CHECKING:
    from testbed.layout import HostState
    from testbed.pytest_plugin import Testbed

pytestmark = pytest.mark.bed  # the stand-in itself, not the launch stage

STANDIN = Path(vllm_standin.__file__)
PIP_SHIM = STANDIN.with_name("pip_shim.py")
MILESTONES = (
    "Platform plugin ascend is activated",
    "Loading weights took",
    "GPU KV cache size:",
    "Graph capturing finished",
    "Application startup complete.",
)
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 120, interval: float = 0.05) -> Any:
    """Poll until `probe()` is truthy (and return it); fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not (result := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return result


def http(url: str, body: Any = None, timeout: float = 5) -> tuple[int, bytes]:
    """GET (or POST `body` as JSON); (status, body). Connection errors and timeouts propagate."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with OPENER.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def healthy(base: str) -> bool:
    with contextlib.suppress(OSError):
        return http(f"{base}/health", timeout=1)[0] == 200
    return False


def chat(base: str, max_tokens: int = 8, timeout: float = 5, **extra: Any) -> dict[str, Any]:
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Why does prefix caching help?"}]}
    status, raw = http(f"{base}/v1/chat/completions", {**body, "max_tokens": max_tokens, **extra}, timeout)
    assert status == 200, raw
    return json.loads(raw)


def answers_within(base: str, seconds: float) -> bool:
    """True when a 1-token chat returns within `seconds`, False when it hangs that long."""
    try:
        return bool(chat(base, 1, timeout=seconds)["choices"])
    except TimeoutError:
        return False


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically, so a running stand-in never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


# --------------------------------------------------------------------------- this machine


def local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def local_model(tmp_path: Path) -> Path:
    model = tmp_path / "Kimi-K3-tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["KimiK3ForConditionalGeneration"]}))
    return model


@pytest.fixture
def run_local(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[bytes], Path]]]:
    """Start `python3 vllm_standin.py serve ...` here; every process is killed after the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"standin-{len(procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(STANDIN), "serve", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        procs.append(proc)
        return proc, log

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def test_every_rendered_serve_command_is_accepted() -> None:
    """Each node's `vllm serve` as tasks.render builds it (DSpark draft included) parses."""
    plan = render_plan(parse_config(with_changes(site_data(), models__draft={"repo": "Inferact/Kimi-K3-DSpark"})))
    for rank, node in enumerate(plan.nodes):
        assert node.serve_argv[:2] == ["vllm", "serve"]
        args = vllm_standin.parse(node.serve_argv[1:])
        assert args.headless == (rank > 0)
        assert args.tokenizer_mode == args.reasoning_parser == args.tool_call_parser == "kimi_k3"
        assert args.data_parallel_size == 4 and args.data_parallel_size_local == 1
        assert args.data_parallel_start_rank == rank
        assert args.speculative_config["method"] == "dspark"
        assert args.compilation_config == {"cudagraph_mode": "FULL_DECODE_ONLY"}


def test_a_rank_suffixed_control_wins_for_that_rank_only(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"K3SIM_STARTUP_S_DP1": 4, "K3SIM_HANG_DP0": ""}))
    env = {"K3SIM_CONTROL_FILE": str(control), "K3SIM_STARTUP_S": "0.5", "K3SIM_HANG": "1"}
    node0, rank1 = vllm_standin.Controls(env, 0), vllm_standin.Controls(env, 1)
    assert (node0.number("K3SIM_STARTUP_S"), rank1.number("K3SIM_STARTUP_S")) == (0.5, 4.0)
    assert node0.flag("K3SIM_HANG") and rank1.flag("K3SIM_HANG")  # an empty rank key does not override


def test_unknown_flags_and_choices_exit_2_like_argparse(local_model: Path) -> None:
    for bad in (["--no-such-flag"], ["--tokenizer-mode", "kimi_k9"], ["--speculative-config", "{not json"]):
        proc = subprocess.run(
            [sys.executable, str(STANDIN), "serve", str(local_model), *bad], capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "error:" in proc.stderr
    assert vllm_standin.parse(["serve", str(local_model), "--max_model_len", "64"]).max_model_len == 64


def test_help_lists_the_kimi_k3_tokenizer_mode_and_parsers() -> None:
    out = subprocess.run(
        [sys.executable, str(STANDIN), "serve", "--help"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("--")}
    for flag in ("--tokenizer-mode", "--reasoning-parser", "--tool-call-parser"):
        assert "kimi_k3" in lines[flag], flag


def test_pip_shim_prints_pip_show_and_warns_about_missing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    versions = standin_image.write_site_packages(site, {"vllm": "0.26.3", "vllm-ascend": "0.26.3rc2"})
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site)}

    def pip(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-S", str(PIP_SHIM), *args]  # -S: only PYTHONPATH, not this machine's site
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)

    both = pip("show", "vllm", "vllm-ascend")
    assert both.returncode == 0 and both.stderr == ""
    first, second = both.stdout.split("---\n")
    assert first.splitlines()[:2] == ["Name: vllm", "Version: 0.26.3"]
    assert second.splitlines()[:2] == ["Name: vllm_ascend", "Version: 0.26.3rc2"]
    assert f"Location: {site}" in first and "Requires: " in first and "Required-by: " in first
    assert versions == {"vllm": "0.26.3", "vllm_ascend": "0.26.3rc2"}
    partly = pip("show", "nope", "vllm")
    assert partly.returncode == 0 and partly.stderr == "WARNING: Package(s) not found: nope\n"  # as pip does
    none = pip("show", "nope")
    assert none.returncode == 1 and none.stdout == "" and "Package(s) not found: nope" in none.stderr
    assert "vllm-0.26.3.dist-info/RECORD" in pip("show", "-f", "vllm").stdout


def test_dp_pair_on_loopback_ready_serving_and_a_dead_rank_hangs_its_share(
    run_local: Callable[..., tuple[subprocess.Popen[bytes], Path]], local_model: Path
) -> None:
    port, rpc = local_port(), local_port()
    base = f"http://127.0.0.1:{port}"
    common = ["--served-model-name", "kimi-k3", "--tokenizer-mode", "kimi_k3", "--reasoning-parser", "kimi_k3",
              "-dp", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
              "--data-parallel-rpc-port", str(rpc), "--port", str(port)]  # fmt: skip
    node0, log0 = run_local(str(local_model), "--host", "127.0.0.1", *common)
    wait_for("node 0's own engine", lambda: "init engine" in log0.read_text())
    with pytest.raises(OSError):
        http(f"{base}/health", timeout=1)  # not listening until every DP rank has joined
    worker, log1 = run_local(str(local_model), "--headless", "--data-parallel-start-rank", "1", *common)
    wait_for("/health", lambda: healthy(base))
    assert "Application startup complete." in log0.read_text()
    assert "Graph capturing finished" in log1.read_text() and worker.poll() is None
    models = json.loads(http(f"{base}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["kimi-k3"]
    for _ in range(4):  # round-robin over both ranks
        message = chat(base)["choices"][0]["message"]
        assert message["reasoning"] and message["content"] is None  # 8 tokens: all spent thinking
    metrics = http(f"{base}/metrics")[1].decode()
    assert 'vllm:request_success_total{engine="1",finished_reason="length",model_name="kimi-k3"} 2.0' in metrics
    worker.kill()
    worker.wait(timeout=10)
    outcomes = [answers_within(base, 5) for _ in range(4)]
    assert True in outcomes and False in outcomes  # requests routed to the dead rank never return
    assert healthy(base) and node0.poll() is None


def test_control_file_flips_a_running_server(
    run_local: Callable[..., tuple[subprocess.Popen[bytes], Path]], local_model: Path, tmp_path: Path
) -> None:
    control = tmp_path / "k3sim.json"
    port = local_port()
    base = f"http://127.0.0.1:{port}"
    env = {"K3SIM_CONTROL_FILE": str(control)}
    proc, log = run_local(str(local_model), "--port", str(port), "--served-model-name", "kimi-k3", env=env)
    wait_for("/health", lambda: healthy(base))
    write_json(control, {"K3SIM_HANG": True})
    assert wait_for("requests to hang", lambda: not answers_within(base, 0.5))
    assert healthy(base)
    write_json(control, {"K3SIM_FATAL_LINE": "ERROR NPU out of memory", "K3SIM_FATAL_KEEP_RUNNING": 1})
    wait_for("the fatal line", lambda: "ERROR NPU out of memory" in log.read_text())
    assert answers_within(base, 5) and proc.poll() is None  # HANG is gone from the file again
    write_json(control, {"K3SIM_DIE_AFTER_S": 0, "K3SIM_DIE_EXIT_CODE": 7})
    assert proc.wait(timeout=30) == 7


# --------------------------------------------------------------------------- the bed


@pytest.fixture
def bed_run(testbed: Testbed, testbed_docker: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """run(host, argv, env=..., ...) -> a detached container of the bed image, removed after the test."""
    made: list[Any] = []
    tag = uuid.uuid4().hex[:8]

    def run(host: HostState, argv: list[str], env: dict[str, str] | None = None, image: str | None = None) -> Any:
        client = testbed_docker(host)
        container = client.containers.run(
            image or testbed.image_ref_by_digest,
            argv,
            name=f"k3sim-test-{tag}-{len(made)}",
            environment=env or {},
            network_mode="host",
            volumes={host.model_root: {"bind": host.model_root}},
            labels={"k3deploy.test": "standin"},
            detach=True,
        )
        made.append(container)
        return container

    try:
        yield run
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                container.remove(force=True)


@pytest.fixture
def bed_model(testbed: Testbed) -> Iterator[Callable[[HostState], str]]:
    """model(host) -> a model folder in the host's model root, as the models stage leaves it."""
    name = f"k3sim-model-{uuid.uuid4().hex[:8]}"
    made: set[Path] = set()

    def model(host: HostState) -> str:
        folder = Path(host.srv_dir) / "models" / name  # the host's /srv is this folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"architectures": ["KimiK3ForConditionalGeneration"]}))
        made.add(folder)
        return f"{host.model_root}/{name}"

    try:
        yield model
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def free_ports(testbed: Testbed, host: HostState, count: int = 1) -> list[int]:
    """`count` different ports, free in that host's network namespace."""
    code = (
        "import socket; s=[socket.socket() for _ in range(COUNT)]; [x.bind(('', 0)) for x in s]; "
        "print(*[x.getsockname()[1] for x in s])"
    ).replace("COUNT", str(count))
    return [int(p) for p in testbed.ssh(host, f'python3 -c "{code}"').stdout.split()]


def logs(container: Any) -> str:
    return container.logs().decode(errors="replace")


def exit_code(container: Any, timeout: float = 60) -> int:
    return int(container.wait(timeout=timeout)["StatusCode"])


@pytest.mark.testbed
@pytest.mark.bed
def test_image_answers_pip_show_help_and_version(testbed: Testbed, bed_run: Callable[..., Any]) -> None:
    host = testbed.hosts[0]
    versions = testbed.state.image["versions"]
    show = bed_run(host, ["pip", "show", "vllm", "vllm-ascend"])
    assert exit_code(show) == 0
    out = logs(show)
    assert f"Name: vllm\nVersion: {versions['vllm']}\n" in out
    assert f"Name: vllm_ascend\nVersion: {versions['vllm_ascend']}\n" in out
    assert "Location: /usr/local/lib/python3.11/dist-packages" in out
    probe = bed_run(host, ["bash", "-c", "vllm serve --help | grep -c kimi_k3; vllm --version; python -m pip -V"])
    assert exit_code(probe) == 0
    count, version, pip_version = logs(probe).splitlines()
    assert int(count) >= 3 and version == versions["vllm"] and pip_version.startswith("pip ")
    assert show.image.attrs["Config"]["Cmd"] == ["/bin/bash"]
    bad = bed_run(host, ["vllm", "serve", "/srv/models/x", "--no-such-flag"])
    assert exit_code(bad) == 2 and "unrecognized arguments: --no-such-flag" in logs(bad)


@pytest.mark.testbed
@pytest.mark.bed
def test_a_second_image_can_carry_other_versions(testbed: Testbed, bed_run: Callable[..., Any]) -> None:
    ref = f"{testbed.registry}/k3deploy/standin-versions:vllm-0.26.0"  # same content each run: one tag
    other = standin_image.build_and_push(
        ref, Path(testbed.state.state_dir), {"vllm": "0.26.0", "vllm_ascend": "0.26.0rc2"}
    )
    assert other.digest != testbed.image_digest
    show = bed_run(testbed.hosts[-1], ["pip", "show", "vllm", "vllm-ascend"], image=other.ref_by_digest)
    assert exit_code(show) == 0
    assert "Version: 0.26.0\n" in logs(show) and "Version: 0.26.0rc2\n" in logs(show)


@pytest.mark.testbed
def test_node0_and_a_headless_rank_on_two_hosts(
    testbed: Testbed, bed_run: Callable[..., Any], bed_model: Callable[[HostState], str]
) -> None:
    head, worker_host = testbed.hosts[0], testbed.hosts[1]
    port, rpc = free_ports(testbed, head, 2)
    base = f"http://{head.ip}:{port}"
    common = ["--served-model-name", "kimi-k3", "--tokenizer-mode", "kimi_k3", "--quantization", "ascend",
              "--port", str(port), "-dp", "2", "--data-parallel-size-local", "1",
              "--data-parallel-address", head.ip, "--data-parallel-rpc-port", str(rpc),
              "--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}']  # fmt: skip
    node0 = bed_run(head, ["vllm", "serve", bed_model(head), "--host", "0.0.0.0", *common])
    wait_for("node 0's engine", lambda: "init engine" in logs(node0))
    with pytest.raises(OSError):
        http(f"{base}/health", timeout=1)  # waits for the headless rank
    worker = bed_run(
        worker_host, ["vllm", "serve", bed_model(worker_host), "--headless", "--data-parallel-start-rank", "1", *common]
    )
    wait_for("/health from the controller", lambda: healthy(base))
    for line in MILESTONES:
        assert line in logs(node0), line
    assert "Graph capturing finished" in logs(worker) and "Application startup complete." not in logs(worker)
    assert [m["id"] for m in json.loads(http(f"{base}/v1/models")[1])["data"]] == ["kimi-k3"]
    answer = chat(base, 64, chat_template_kwargs={"thinking": False})
    assert answer["choices"][0]["message"]["content"] and answer["choices"][0]["finish_reason"] == "stop"
    status, raw = http(f"{base}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True})
    events = [line for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "data: [DONE]" and len(events) > 3
    worker.reload()
    assert worker.status == "running"
    worker.kill()
    outcomes = [answers_within(base, 5) for _ in range(4)]
    assert True in outcomes and False in outcomes  # the dead rank's share hangs
    assert healthy(base)  # while /health stays 200
    node0.reload()
    assert node0.status == "running"


@pytest.mark.testbed
def test_a_headless_rank_without_node0_waits_then_gives_up_with_rc_0(
    testbed: Testbed, bed_run: Callable[..., Any], bed_model: Callable[[HostState], str]
) -> None:
    host, absent = testbed.hosts[-1], testbed.hosts[0]
    (rpc,) = free_ports(testbed, absent)  # nobody listens there: node 0 never started
    argv = ["vllm", "serve", bed_model(host), "--headless", "-dp", "2", "--data-parallel-start-rank", "1",
            "--data-parallel-address", absent.ip, "--data-parallel-rpc-port", str(rpc)]  # fmt: skip
    patient = bed_run(host, argv)
    impatient = bed_run(host, argv, env={"K3SIM_FRONTEND_TIMEOUT_S": "1"})
    assert exit_code(impatient) == 0  # as real vLLM: a failure that exits 0
    assert "EngineCore failed to start" in logs(impatient)
    wait_for("the waiting line", lambda: "Waiting for init message from front-end." in logs(patient))
    patient.reload()
    assert patient.status == "running"


@pytest.mark.testbed
@pytest.mark.faults
def test_fatal_line_and_die_controls(
    testbed: Testbed, bed_run: Callable[..., Any], bed_model: Callable[[HostState], str]
) -> None:
    host = testbed.hosts[-1]

    def serve(env: dict[str, str]) -> Any:
        return bed_run(host, ["vllm", "serve", bed_model(host), "--port", str(free_ports(testbed, host)[0])], env)

    fatal = "(EngineCore_DP0 pid=41) ERROR 11-30 10:00:03 [core.py:708] EngineCore failed to start."
    dies_on_line = serve({"K3SIM_FATAL_LINE": fatal, "K3SIM_FATAL_AFTER_S": "0.3", "K3SIM_STARTUP_S": "30"})
    keeps_running = serve({"K3SIM_FATAL_LINE": "Watchdog caught collective operation timeout",
                           "K3SIM_FATAL_KEEP_RUNNING": "1"})  # fmt: skip
    dies = serve({"K3SIM_DIE_AFTER_S": "1", "K3SIM_DIE_EXIT_CODE": "137", "K3SIM_STARTUP_S": "30"})
    assert exit_code(dies_on_line) == 1 and logs(dies_on_line).rstrip().endswith(fatal)
    assert exit_code(dies) == 137 and "Application startup complete." not in logs(dies)
    wait_for(
        "the kept-running fatal line", lambda: "Watchdog caught collective operation timeout" in logs(keeps_running)
    )
    wait_for("start-up after the line", lambda: "Application startup complete." in logs(keeps_running))
    keeps_running.reload()
    assert keeps_running.status == "running"


@pytest.mark.testbed
@pytest.mark.faults
def test_hang_flipped_on_a_running_container_through_its_model_root(
    testbed: Testbed, bed_run: Callable[..., Any], bed_model: Callable[[HostState], str]
) -> None:
    host = testbed.hosts[0]
    model = bed_model(host)
    control = Path(host.srv_dir) / model.removeprefix("/srv/") / "k3sim.json"  # seen in the container at model/
    (port,) = free_ports(testbed, host)
    base = f"http://{host.ip}:{port}"
    env = {"K3SIM_CONTROL_FILE": f"{model}/k3sim.json"}
    bed_run(host, ["vllm", "serve", model, "--port", str(port), "--served-model-name", "kimi-k3"], env)
    wait_for("/health", lambda: healthy(base))
    assert answers_within(base, 5)
    write_json(control, {"K3SIM_HANG": "1"})
    assert wait_for("requests to hang", lambda: not answers_within(base, 1.0))
    assert healthy(base)
    write_json(control, {})
    assert wait_for("requests to come back", lambda: answers_within(base, 5))
