"""Point-to-point collective algorithms as transport-free state machines (``p2p``, ``p2p_hier``, ``sparse_p2p``) and NCCL's double binary tree (``tree``)."""
