"""Test-harness stub, not torchvision."""
