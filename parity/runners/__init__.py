"""One runner per framework: a schedule's loss, gradients, trained weights and memory on one batch."""
