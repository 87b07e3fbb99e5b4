"""What a training job uses: the rows as a torch dataset, and the glm5 mask for a job that tokenizes
on the fly (miles' patched loss-mask generator)."""
