"""Test-harness stub, not torchvision."""
import enum


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    RGB = 3
def decode_image(*a, **k):
    raise NotImplementedError("torchvision stub: no image decoding")
