"""Test-harness stub, not torchvision."""
def pil_to_tensor(*a, **k):
    raise NotImplementedError("torchvision stub")
