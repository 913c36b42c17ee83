"""The closed forms emu's network should reproduce (``forms``; on a topology, ``topology``)."""
