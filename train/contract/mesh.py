"""Parallel dimensions: validated in one place, turned into a DeviceMesh in one place.

Ranks are laid out with the tensor dimension innermost, then data, then pipeline:
``rank = (pp_index * dp + dp_index) * tp + tp_index``. Ranks of a node are consecutive,
so a tensor group stays inside a node exactly when ``tp`` divides the ranks per node.
Pure Python (torch is imported only to build the mesh), so the cluster driver can validate
a 1024-node plan with it in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from train.contract.config import ModelConfig, ParallelConfig
from train.contract.errors import ConfigError
from train.contract.strategies import STRATEGIES


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of ``rank``: {"pp": i, "dp": j, "tp": k}."""
        rest, tp_index = divmod(rank, self.tp)
        pp_index, dp_index = divmod(rest, self.dp)
        return {"pp": pp_index, "dp": dp_index, "tp": tp_index}

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Named dimensions of size > 1, outermost first."""
        dims = [("pp", self.pp), ("dp", self.dp), ("tp", self.tp)]
        kept = [(n, s) for n, s in dims if s > 1]
        return tuple(s for _, s in kept), tuple(n for n, _ in kept)

    def build_mesh(self, device_type: str):
        shape, names = self.mesh_shape()
        if not shape:
            return None
        from torch.distributed.device_mesh import init_device_mesh  # heavy: imported when used

        return init_device_mesh(device_type, shape, mesh_dim_names=names)


def resolve_dims(parallel: ParallelConfig, model: ModelConfig, world_size: int, ranks_per_node: int) -> ParallelDims:
    """The dimensions of ``parallel.strategy`` on ``world_size`` ranks, or ConfigError naming the dimension."""
    strategy = parallel.strategy
    facts = STRATEGIES[strategy]
    if facts.one_process:
        if world_size != 1:
            raise ConfigError(
                "parallel.strategy", f"{strategy} runs in one process, but the world size is {world_size}"
            )
        if strategy == "model_parallel" and parallel.stages > model.n_layers:
            raise ConfigError("parallel.stages", f"{parallel.stages} stages > model.n_layers={model.n_layers}")
        return ParallelDims()
    if world_size == 1 and facts.splits:
        raise ConfigError(
            "parallel.strategy",
            f"{strategy} {facts.splits} across ranks: one rank has nothing to split "
            "(run it on 2 or more ranks, or use parallel.strategy=single)",
        )
    if strategy == "pipeline":
        pp = parallel.pp or world_size
        if pp != world_size:
            raise ConfigError(
                "parallel.pp", f"pipeline uses every rank as a stage: pp={pp} must equal the world size {world_size}"
            )
        if pp > model.n_layers:
            raise ConfigError("parallel.pp", f"{pp} pipeline stages > model.n_layers={model.n_layers}")
        if parallel.tp not in (None, 1):
            raise ConfigError("parallel.tp", "pipeline does not combine with tensor parallelism")
        return ParallelDims(pp=pp)
    if parallel.pp not in (None, 1):
        raise ConfigError("parallel.pp", f"pp={parallel.pp} needs parallel.strategy=pipeline")
    tp = parallel.tp or (ranks_per_node if strategy == "tp" else 1)
    if tp > 1 and not facts.with_tp:
        *others, last = (name for name, f in STRATEGIES.items() if f.with_tp)
        raise ConfigError(
            "parallel.tp", f"{strategy} does not combine with tensor parallelism (use {', '.join(others)} or {last})"
        )
    if world_size % tp:
        raise ConfigError("parallel.tp", f"tensor dimension {tp} does not divide the world size {world_size}")
    if ranks_per_node % tp:
        raise ConfigError(
            "parallel.tp",
            f"tensor dimension {tp} does not divide the {ranks_per_node} ranks per node: "
            "a tensor group would cross nodes",
        )
    if tp > 1 and model.dim_hidden % tp:
        raise ConfigError("parallel.tp", f"tensor dimension {tp} does not divide model.dim_hidden={model.dim_hidden}")
    dp = world_size // tp
    if strategy == "fsdp" and tp > 1 and dp == 1:
        raise ConfigError(
            "parallel.tp",
            f"fsdp with tp={tp} on {world_size} ranks leaves one data-parallel rank, nothing to shard over "
            "(use parallel.strategy=tp, or more ranks than tp)",
        )
    if strategy == "fsdp":
        return ParallelDims(dp_shard=dp, tp=tp)
    return ParallelDims(dp_replicate=dp, tp=tp)
