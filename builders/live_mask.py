"""The live mask's import path from before 0.2.

It is the import path that miles patched by ``patches/patch_glm5_mask.py`` before 0.2 uses. The
live mask is ``builders.training.live_mask``.
"""

from builders.training.live_mask import glm5_loss_mask

__all__ = ["glm5_loss_mask"]
