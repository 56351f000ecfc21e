"""OCP MX v1.0: the format table and the conversion / dot-product rules."""
from .formats import ALIASES, BLOCK_SIZE, E8M0, FORMATS, ElementFormat, ScaleFormat, get_format
from .rules import (CONVERSION_SECTION, DEFAULT_CHOICES, DOT_SECTION, ROUNDINGS, SCALE_RULES,
                    check_rounding, check_scale_rule)

__all__ = [
    "ALIASES", "BLOCK_SIZE", "E8M0", "FORMATS", "ElementFormat", "ScaleFormat", "get_format",
    "CONVERSION_SECTION", "DEFAULT_CHOICES", "DOT_SECTION", "ROUNDINGS", "SCALE_RULES",
    "check_rounding", "check_scale_rule",
]
