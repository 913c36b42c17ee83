"""What the workers send: generated payload (``generated``) and the real ranks' recorded tensors (``recorded``)."""
