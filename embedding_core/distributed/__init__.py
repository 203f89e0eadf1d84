"""Devices and processes: the mesh, sharded batches, and work split over several hosts."""
