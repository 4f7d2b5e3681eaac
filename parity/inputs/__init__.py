"""What the cases run on: model presets, real checkpoints, the bundled corpus and sentences."""
