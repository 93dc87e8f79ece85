"""Foundations every layer uses: errors, split names, fingerprints, progress, threads, YAML."""
