"""The encoders and their pretrained weights: architectures, checkpoints, hub and packages."""
