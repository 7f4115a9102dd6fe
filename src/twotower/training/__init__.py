"""Training: losses, gradient caching, hard-negative mining, the trainer."""
