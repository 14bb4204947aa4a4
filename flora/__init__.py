"""Flora: an open robot data engine.

Episodes -> windows -> model outputs -> stitched tables -> validation -> curation ->
training sets -> models -> registry -> pods. See docs/ and ../shared/DESIGN.md.
"""

__version__ = "0.1.0"
