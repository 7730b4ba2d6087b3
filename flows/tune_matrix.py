"""What `tune` varies: server settings (the cells) × bench workloads and concurrencies (seed section 9).

Pure: a cell is a name and dotted-key overrides of the deployment config. Every cell's config is the
deployment's with its overrides, checked as a whole when the matrix is read, so a bad key or value names
the cell and the key before anything runs on a node. The matrix is a YAML file for the CLI and the `tune`
flow's parameter (a form in the Prefect UI).
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import ConfigError, K3DeployError
from k3deploy.flows.run_options import BenchOptions, BenchWorkloads, apply_options

# What a cell may set: the server's settings and the draft. Not where or how it runs (ports, runtime,
# container, readiness): models, comm and image run once for the whole matrix.
TUNABLE = ("serve.", "models.draft")
FIXED = ("serve.runtime", "serve.host", "serve.service_port", "serve.rpc_port", "serve.container", "serve.process",
         "serve.readiness", "serve.liveness", "serve.data_parallel_size", "serve.data_parallel_size_local")  # fmt: skip
CELL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._=+,-]{0,79}$"


class TuneMatrixError(K3DeployError):
    """The matrix asks for what cannot be: the message names the cell and the key."""


class CellSpec(BaseModel):
    """One server setting of the matrix."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=CELL_NAME, description="The cell's label in tables, the report and the frontier.")
    set: dict[str, Any] = Field(
        default_factory=dict,
        description="Dotted config keys and their values, e.g. serve.max_num_seqs: 8 or serve.speculative_config: "
        "{method: ngram, num_speculative_tokens: 3, prompt_lookup_max: 4}; empty: the deployment as it is.",
    )


class TuneMatrix(BaseModel):
    """Server settings × bench workloads and concurrencies; each setting relaunches the service."""

    model_config = ConfigDict(extra="forbid")

    axes: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Dotted config keys and the values to try; every combination is a cell, named key=value,….",
    )
    cells: list[CellSpec] = Field(default_factory=list, description="Further cells, each named, after the axes'.")
    workloads: BenchWorkloads = Field(
        default=BenchWorkloads.as_configured, description="The bench workloads every cell runs."
    )
    concurrency: list[int] = Field(
        default_factory=list,
        description="--max-concurrency values every cell runs (the first, then a sweep); empty: as configured.",
    )
    bench: dict[str, Any] = Field(
        default_factory=dict,
        description="bench.* keys for every cell, e.g. random_output_len: 64 or slo.tpot_ms: 50 (goodput).",
    )
    smoke: bool = Field(default=True, description="Run the smoke checks on every cell before its bench.")
    accuracy: bool = Field(default=False, description="Run the accuracy evaluators on every cell after its bench.")
    reference: str = Field(
        default="",
        description="The cell marked as the reference configuration; empty: the cell that changes nothing.",
    )


def expand(matrix: TuneMatrix) -> list[CellSpec]:
    """The cells in run order: every combination of the axes, then the named cells; names are unique."""
    out: list[CellSpec] = []
    keys = list(matrix.axes)
    for key, values in matrix.axes.items():
        if not values:
            raise TuneMatrixError(f"axes.{key}: give at least one value")
    for combo in itertools.product(*(matrix.axes[k] for k in keys)) if keys else ():
        name = ",".join(f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in zip(keys, combo, strict=True))
        out.append(CellSpec(name=name[:80], set=dict(zip(keys, combo, strict=True))))
    out += matrix.cells
    if not out:
        raise TuneMatrixError("the matrix has no cells: give axes or cells")
    seen: set[str] = set()
    for cell in out:
        if cell.name in seen:
            raise TuneMatrixError(f"two cells are named {cell.name!r}: names must be unique")
        seen.add(cell.name)
    if any(c < 1 for c in matrix.concurrency):
        raise TuneMatrixError(f"concurrency: every value must be ≥ 1, not {matrix.concurrency}")
    if matrix.reference and matrix.reference not in seen:
        raise TuneMatrixError(f"reference: no cell is named {matrix.reference!r}")
    return out


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("method", "custom"))
    return "none" if value is None else json.dumps(value) if not isinstance(value, str) else value


def cell_config(base: DeploymentConfig, cell: CellSpec, matrix: TuneMatrix) -> DeploymentConfig:
    """The deployment with the cell's settings and the matrix's bench choices, checked as a whole."""
    data: dict[str, Any] = base.model_dump(mode="python")
    for key, value in cell.set.items():
        _check_key(cell.name, key)
        _put(data, key, copy.deepcopy(value), cell.name)
    for key, value in matrix.bench.items():
        _put(data, f"bench.{key}", copy.deepcopy(value), cell.name)
    if matrix.concurrency:
        data["bench"]["max_concurrency"] = matrix.concurrency[0]
        data["bench"]["concurrency_sweep"] = list(matrix.concurrency[1:])
    try:
        cfg = DeploymentConfig.model_validate(data)
        return apply_options(cfg, "as configured", BenchOptions(workloads=matrix.workloads))
    except (ConfigError, ValidationError) as err:
        raise TuneMatrixError(f"cell {cell.name}: {err}") from None


def _check_key(cell: str, key: str) -> None:
    if not any(key == t or key.startswith(t if t.endswith(".") else t + ".") for t in TUNABLE):
        raise TuneMatrixError(f"cell {cell}: {key} is not a server setting: a cell sets serve.* or models.draft")
    if any(key == f or key.startswith(f + ".") for f in FIXED):
        raise TuneMatrixError(f"cell {cell}: {key} is fixed for the whole matrix (the service's place and ports)")


def _put(data: dict[str, Any], key: str, value: Any, cell: str) -> None:
    parts = key.split(".")
    here: Any = data
    for i, part in enumerate(parts[:-1]):
        if not isinstance(here, dict) or part not in here:
            raise TuneMatrixError(f"cell {cell}: {key}: there is no {'.'.join(parts[: i + 1])} in the config")
        if here[part] is None:
            raise TuneMatrixError(f"cell {cell}: {key}: {'.'.join(parts[: i + 1])} is not set; set it whole")
        here = here[part]
    if not isinstance(here, dict) or (parts[-1] not in here and not _open_mapping(parts)):
        raise TuneMatrixError(f"cell {cell}: {key}: there is no such key in the config")
    here[parts[-1]] = value


def _open_mapping(parts: list[str]) -> bool:
    """Keys under a mapping of free keys (serve.env.X, a speculative or compilation config's own keys)."""
    return len(parts) >= 3 and parts[1] in ("env", "speculative_config", "compilation_config")


def reference_cell(matrix: TuneMatrix, cells: list[CellSpec], base: DeploymentConfig) -> str | None:
    """The cell named as reference, else one whose settings equal the deployment's own (it changes nothing)."""
    if matrix.reference:
        return matrix.reference
    data = base.model_dump(mode="json")
    for cell in cells:
        if all(_get(data, key) == _jsonable(value) for key, value in cell.set.items()):
            return cell.name
    return None


def _get(data: dict[str, Any], key: str) -> Any:
    here: Any = data
    for part in key.split("."):
        if not isinstance(here, dict):
            return object()
        here = here.get(part)
    return here


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def describe(cell: CellSpec) -> str:
    """'serve.max_num_seqs=8, …' or 'as configured'."""
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in cell.set.items()) or "as configured"
