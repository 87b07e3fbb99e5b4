"""What a training job uses: a torch dataset, the live glm5 mask.

The rows as a torch dataset, and the glm5 mask for a job that tokenizes on the fly (miles' patched
loss-mask generator).
"""
