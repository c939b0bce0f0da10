"""Ray topology (placement groups, role groups), DeepSpeed training, weight sync."""
from asr_grpo.distributed.net import free_port
from asr_grpo.distributed.placement import (
           PlacementError,
           PlacementPlan,
           create_placement_group,
           plan_placement,
           role_counts,
)
from asr_grpo.distributed.ray_cluster import shutdown_ray, start_ray
from asr_grpo.distributed.role_group import RoleBase, RoleGroup

__all__ = ["PlacementError", "PlacementPlan", "RoleBase", "RoleGroup", "create_placement_group", "free_port",
           "plan_placement", "role_counts", "shutdown_ray", "start_ray"]
