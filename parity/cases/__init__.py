"""The case sets the harness runs (quick/full suite, stress, depth sweep, GPU pass) and their case loop."""
