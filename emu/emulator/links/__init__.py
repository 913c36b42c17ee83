"""The links: their specification and model (``spec``), topologies of nodes and leaves (``topology``), loss under payload scale (``scaled_loss``)."""
