"""OCP MX v1.0: the format table, the conversion / dot-product rules and their named options,
the block rotations, and the one lowering of a format for kernels."""
from .formats import ALIASES, BLOCK_SIZE, E8M0, FORMATS, ElementFormat, ScaleFormat, get_format
from .lowering import KernelFormat, lower, rounding_thresholds
from .rotation import ROTATION_NAMES, Rotation, parse_rotation
from .rules import (CONVERSION_SECTION, DEFAULT_CHOICES, DOT_SECTION, ROUNDINGS, SCALE_RULES,
                    Rounding, ScaleRule)

__all__ = [
    "ALIASES", "BLOCK_SIZE", "E8M0", "FORMATS", "ElementFormat", "ScaleFormat", "get_format",
    "KernelFormat", "lower", "rounding_thresholds",
    "ROTATION_NAMES", "Rotation", "parse_rotation",
    "CONVERSION_SECTION", "DEFAULT_CHOICES", "DOT_SECTION", "ROUNDINGS", "SCALE_RULES",
    "Rounding", "ScaleRule",
]
