"""OPPO's speedup on hardware we don't have: the project's own RolloutScheduler and
planners drive simulated rollout engines, streaming scorers and trainer on a virtual
clock (`simulator`), with costs from a roofline, a fitted serial run or a measured table
(`profiles`); `report` writes the table, Gantt plot, JSON and MLflow run."""
from asr_grpo.forecast.costs import DecodeCost, Forward, RoleCost, SimProfile
from asr_grpo.forecast.simulator import ModeResult, Simulation, StepRecord, simulate
from asr_grpo.forecast.workload import Workload

__all__ = ["DecodeCost", "Forward", "ModeResult", "RoleCost", "SimProfile", "Simulation", "StepRecord", "Workload",
           "simulate"]
