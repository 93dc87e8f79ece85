"""Files that survive kill -9: atomic writes, full disks, the run lock, checksummed shard sets
(their payload formats and per-rank manifest parts) and completion stamps."""
