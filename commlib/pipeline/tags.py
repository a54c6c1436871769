"""Tags of the messages that carry gradients back along a point-to-point
edge, shared by every frontend so that a torch sender and a TensorFlow
receiver (or two processes of different frontends) agree.

A differentiable message sent with tag ``t`` (0 <= t < 2**62) has its
gradient sent back, by the receiver to the sender, with tag
``gradient_tag(t) = t + 2**62``: the upper half of the tag space is reserved
for gradients, so a gradient never meets a forward message of the same pair
of ranks.
"""
from __future__ import annotations

GRADIENT_TAG_BASE = 1 << 62


def check_forward_tag(tag) -> int:
    """``tag`` as an int, ValueError unless it is a forward tag (below 2**62)."""
    if isinstance(tag, bool) or not hasattr(tag, "__index__"):
        raise TypeError(f"tag must be an int, got {type(tag).__name__}")
    tag = int(tag)
    if not 0 <= tag < GRADIENT_TAG_BASE:
        raise ValueError(f"a differentiable send/recv needs a tag between 0 and 2**62-1 (the "
                         f"upper half carries gradients), got {tag}")
    return tag


def gradient_tag(tag) -> int:
    """The tag that carries the gradient of a message sent with ``tag``."""
    return check_forward_tag(tag) + GRADIENT_TAG_BASE
