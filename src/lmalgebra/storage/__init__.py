"""Files that survive kill -9: atomic writes, full disks, the run lock, the shard set."""
