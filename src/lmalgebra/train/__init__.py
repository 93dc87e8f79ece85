"""Training: losses, schedules, checkpoints, and the one loop for pre-training and distillation."""
