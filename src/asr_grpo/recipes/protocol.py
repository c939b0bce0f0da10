"""What a recipe is to the entry point that runs it: set up, train, and clean up whatever
happened (torchtune states its recipe interface the same way)."""
from __future__ import annotations

from typing import Protocol


class Recipe(Protocol):
    def setup(self) -> None:
        """Validate the config and start what the loop needs (data, workers), before any step."""

    def train(self) -> dict:
        """Run the loop; returns the run's summary."""

    def cleanup(self) -> None:
        """Release the workers and the cluster; runs after a failure too."""


def run_recipe(recipe: Recipe) -> dict:
    """Set `recipe` up and train it; clean up in any case."""
    try:
        recipe.setup()
        return recipe.train()
    finally:
        recipe.cleanup()
