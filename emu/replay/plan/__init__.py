"""Planning a replay before any process starts: each worker's program (``programs``), a mesh's layout, the payload's sparsity and compression, adaptive compression's passes, recorded payloads."""
