"""The three splits every run is scored on, in their fixed order."""

SPLITS = ("train", "validation", "test")
