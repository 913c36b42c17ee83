"""A replay spread over several machines: joining them (``cluster``), hosting a share (``remote``), sealed messages (``sealed``)."""
