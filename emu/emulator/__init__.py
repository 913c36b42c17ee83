"""The emulated network: wire format, the Fabric interface, software fabrics, link model.

Filled by the replay issue; it may import ``emu.traces`` only.
"""
