"""Training scripts of sharded and split parallelism, as users write them (they know nothing of emu).

``emu capture --model fsdp|tp|pp`` runs them unmodified, as it would a user's script, and
``examples/`` links to them. Each is a plain torchrun script on gloo.
"""
