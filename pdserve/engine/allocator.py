"""The engine's block allocator: FlowKV's segment allocator and alignment.

The logic lives in `pdserve.instance.segments` (no torch), so the simulator allocates block
ids and counts aligned transfer runs with the same code the engine runs.
"""

from pdserve.instance.segments import Fragmentation, SegmentAllocator, align, runs

__all__ = ["Fragmentation", "SegmentAllocator", "align", "runs"]
