"""One exception hierarchy for the whole project.

Every message must let a person act: name the node, file, field or check that failed
and say what was expected. Secrets never appear in a message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from k3deploy.core.stage import StageResult


class K3DeployError(Exception):
    """Base of every error k3deploy raises on purpose."""

    # Whose problem it is (a k3deploy.core.stage.FailureClass value); None: the failing stage's own default.
    failure_class: ClassVar[str | None] = None


class ConfigError(K3DeployError):
    """The configuration document is invalid; raised before anything touches a node."""

    failure_class = "configuration"

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        self.lines = [f"{where}{field}: {msg}" if field else f"{where}{msg}" for field, msg in problems]
        super().__init__("invalid configuration\n  " + "\n  ".join(self.lines))


class TeardownIncomplete(K3DeployError):
    """Teardown removed what it could; some nodes were not cleared (unreachable, untrusted, or a server stuck)."""

    failure_class = "infrastructure"

    def __init__(self, removed: dict[str, list[str]], problems: dict[str, str]) -> None:
        self.removed, self.problems = removed, problems
        lines = [f"{node}: {why}" for node, why in problems.items()]
        done = sum(map(len, removed.values()))
        super().__init__(
            f"teardown incomplete on {len(problems)} node(s) ({done} removed elsewhere); run it again once they "
            "are reachable:\n  " + "\n  ".join(lines)
        )

    def __reduce__(self) -> tuple[type[TeardownIncomplete], tuple[dict[str, list[str]], dict[str, str]]]:
        return (type(self), (self.removed, self.problems))


class ClusterBusy(K3DeployError):
    """Another run holds the cluster (and this one was told to refuse, or waited long enough)."""

    failure_class = "infrastructure"


class UnreadableEvidence(K3DeployError, ValueError):
    """A tool's output or a run record is damaged or is not what it writes; the message names the file and key."""

    failure_class = "tool"


class NodeError(K3DeployError):
    """Something went wrong on one node; the message starts with the node's name."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node


class ToolFailed(NodeError):
    """The bench tool or an evaluator crashed, timed out or wrote nothing readable on a node."""

    failure_class = "tool"


class ServiceLost(NodeError):
    """A server of the run exited, logged a fatal line or got stuck while a stage was using the service."""

    failure_class = "engine"

    def __init__(
        self, stage: str, node: str, rank: int, reason: str, log_line: int | None = None, named: str | None = None,
        family: str | None = None,
    ) -> None:  # fmt: skip
        # named: whose problem the rank's own cause line says it is (a FailureClass value), when it says
        self.stage, self.rank, self.reason, self.log_line, self.named, self.family = (
            stage, rank, reason, log_line, named, family
        )  # fmt: skip
        super().__init__(node, f"DP rank {rank}: {reason}")

    def __reduce__(self) -> tuple[type[ServiceLost], tuple[object, ...]]:
        return (type(self), (self.stage, self.node, self.rank, self.reason, self.log_line, self.named, self.family))


class TransportError(K3DeployError):
    """A node could not be reached or talked to."""

    failure_class = "infrastructure"

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(f"{host}: {message}")


class HostKeyError(TransportError):
    """The node's host key is unknown or differs from the pinned one."""


class ConnectionFault(TransportError):
    """The connection failed or dropped; safe to retry."""


class CommandTimeout(TransportError):
    """A remote command ran past its timeout and was killed on the node."""

    def __init__(self, host: str, message: str, stdout: str = "", stderr: str = "") -> None:
        self.stdout, self.stderr = stdout, stderr
        super().__init__(host, message)


class CommandFailed(TransportError):
    """A command ran on the node and exited non-zero; never retried."""

    def __init__(self, host: str, command: str, exit_code: int, stderr: str) -> None:
        self.command = command
        self.exit_code = exit_code
        self.stderr = stderr
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else "(no stderr)"
        super().__init__(host, f"command exited {exit_code}: {command!r}: {tail}")


class HubError(K3DeployError):
    """A model hub could not list or serve a checkpoint."""

    failure_class = "infrastructure"


class StageFailed(K3DeployError):
    """A stage ended with a failed verdict; `result` (a StageResult) carries every finding."""

    def __init__(self, result: StageResult) -> None:
        from k3deploy.core.stage import failure_lines

        self.result = result
        lines = failure_lines(result.findings)
        head = f"{result.stage} failed: {result.reason or result.summary or 'see its findings'}"
        super().__init__(head + "".join(f"\n  {line}" for line in lines if line not in head))

    def __reduce__(self) -> tuple[type[StageFailed], tuple[StageResult]]:
        # Prefect may persist a failed task's exception: unpickled, it must still carry its result.
        return (type(self), (self.result,))


class PreflightFailed(StageFailed):
    """A node is unreachable, untrusted, or lacks what the deployment needs."""

    failure_class = "infrastructure"


class ModelsStageFailed(StageFailed):
    """A checkpoint is missing, corrupt, different across nodes, or does not fit the deployment."""

    failure_class = "infrastructure"


class CommStageFailed(StageFailed):
    """A node, NPU or link failed a communication check."""

    failure_class = "infrastructure"


class ImageStageFailed(StageFailed):
    """The nodes do not all hold one image, or it lacks what Kimi-K3 needs."""

    failure_class = "infrastructure"


class LaunchStageFailed(StageFailed):
    """The service did not come up: a fatal line, a container exit, or the ready timeout."""

    failure_class = "engine"


class SmokeStageFailed(StageFailed):
    """A smoke check failed: a request failed or its answer lacked what the check asserts."""

    failure_class = "model"


class ConformanceStageFailed(StageFailed):
    """A conformance rule failed: a tool call, a stream, a usage count, a parameter check or the reasoning split."""

    failure_class = "engine"


class BenchStageFailed(StageFailed):
    """A benchmark request failed, the tool failed, or a metric missed its baseline."""

    failure_class = "engine"


class CapacityStageFailed(StageFailed):
    """The capacity search could not conclude (a probe that is no evidence), nothing held the SLOs, or the capacity
    found is below capacity.min_concurrency."""

    failure_class = "engine"


class SoakStageFailed(StageFailed):
    """A soak window failed (a request, a rank, a fatal line), or its latency, throughput or memory drifted."""

    failure_class = "engine"


class AccuracyStageFailed(StageFailed):
    """An evaluator failed, lost samples, or its score is off its baseline."""

    failure_class = "model"


class TeardownFailed(StageFailed):
    """A node's containers could not all be removed, or the node could not be reached."""

    failure_class = "infrastructure"


class ValidateFailed(K3DeployError):
    """The validate run failed; the message names the first stage that failed."""


class AlertNotSent(K3DeployError):
    """The alert webhook did not take a run's message; the run's verdict stands (only the alert task fails)."""
